"""Registers the commands that live beside their subsystems (worker, serve, keygen)."""

from __future__ import annotations
