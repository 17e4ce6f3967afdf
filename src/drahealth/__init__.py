"""drahealth: Kubernetes DRA device health, end to end."""

__version__ = "0.1.0"
