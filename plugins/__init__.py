"""schedlab's built-in plugins, registered through the same hooks as third-party ones."""
