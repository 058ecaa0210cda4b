"""Blocking and Trio clients over one sans-IO core."""
