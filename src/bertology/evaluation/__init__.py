"""Downstream metrics computed as the official scripts compute them, and the files runs write."""
