"""What pidquorum's tools and tests install from the system: Debian packages with apt-get (``provision.apt``)."""
