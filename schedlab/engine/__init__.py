"""schedlab engine."""
