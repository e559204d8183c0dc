"""The model catalog of a multi-model gateway and its --models-config file."""
