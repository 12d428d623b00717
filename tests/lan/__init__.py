"""LAN tests: several gpulayerd hosts as network namespaces on one bridge (see harness.py)."""
