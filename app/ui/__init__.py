"""The desktop window (PySide6 + qasync). The only package that imports Qt; see docs/desktop.md."""
