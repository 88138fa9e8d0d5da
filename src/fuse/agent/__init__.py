"""The fuse host agent: probes its machine, admits and runs VMs, and serves
the public host API that the controller (or any operator) calls."""
