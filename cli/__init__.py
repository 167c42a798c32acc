"""pidctl, the command line."""
