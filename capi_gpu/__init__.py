"""capi-gpu: a Cluster API infrastructure provider for Hetzner GPU dedicated servers.

Turns leased Robot servers (GEX131, one RTX PRO 6000 Blackwell) into Kubernetes nodes that already
advertise the MIG devices their claims ask for, and gates them until the GPU is really ready.
"""

__version__ = "0.1.0"
