"""The built-in preprocessing recipes, one TOML file each (``cachekit recipes`` lists them)."""
