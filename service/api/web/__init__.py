"""The pages the gateway serves: the playground (/) and the dashboard (/dashboard)."""
