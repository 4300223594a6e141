"""Hetzner clients: Robot (httpx + tenacity + one account-wide budget) and hcloud (control-plane LB)."""
