"""The tvmgrad version: the one place it is written (pyproject.toml reads it from here, the
package re-exports it, kernel cache keys and AOT manifests record it)."""

__version__ = "0.1.0"
