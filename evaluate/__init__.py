"""quantbench evaluate stage: artifact x scenarios x runs -> results rows."""
