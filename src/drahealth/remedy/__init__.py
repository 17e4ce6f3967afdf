"""The remediation controller: policy -> DeviceTaintRule / eviction -> verified untaint."""
