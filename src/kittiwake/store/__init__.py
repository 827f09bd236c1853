"""Durable stores: the only package that touches disk."""
