"""Storage tiers behind one interface (``base.Tier``); one module per tier."""
