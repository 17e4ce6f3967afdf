"""``python -m drahealth.controlplane``: the same as ``drahealth apiserver``."""

from drahealth.cli.apiserver import apiserver_command

if __name__ == "__main__":
    apiserver_command(prog_name="drahealth apiserver")
