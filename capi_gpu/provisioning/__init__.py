"""Getting a leased server from the pool to a joined node: state machine, SSH, installimage, Ansible."""
