"""DeepPool: foreground/background multiplexing of a device."""
