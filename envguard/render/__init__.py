"""Renderers: pure functions from plain data to text or rich renderables."""
