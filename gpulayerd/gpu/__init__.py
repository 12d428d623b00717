"""Hardware and environment detection, and the support matrix."""
