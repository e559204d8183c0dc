"""The models a multi-model gateway serves: their catalog, per-model settings and loading."""
