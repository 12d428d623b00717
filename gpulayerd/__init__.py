"""gpulayerd: GPU compute sharing for a lab's workstations."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
