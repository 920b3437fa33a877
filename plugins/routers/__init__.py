"""Built-in routers."""
