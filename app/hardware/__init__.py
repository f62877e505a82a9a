"""What this machine has."""
