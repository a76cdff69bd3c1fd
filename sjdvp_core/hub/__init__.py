"""Getting models: the catalogue of releases, resumable verified downloads, and the check
command."""
