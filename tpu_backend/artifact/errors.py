"""Errors the artifact loader raises. Each names the file and what is wrong with it."""

from __future__ import annotations

__all__ = ["ArtifactError", "ArtifactVersionError", "ArtifactCorruptError", "ManifestError"]


class ArtifactError(Exception):
    """A TPU artifact could not be written or read."""


class ArtifactVersionError(ArtifactError):
    """The artifact's format version is outside the window this loader reads."""


class ArtifactCorruptError(ArtifactError):
    """A file of the artifact is missing, truncated, or does not match its recorded sha256."""


class ManifestError(ArtifactError):
    """manifest.json is malformed, or was edited after it was written."""
