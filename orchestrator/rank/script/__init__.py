"""The torchrun script path in a rank child.

    bootstrap.py  runs the user's script as `__main__` (and starts every rank child)

bootstrap.py is started by its file's path, so this folder is the child's sys.path[0] until the
script's own folder replaces it: it holds nothing a rank imports by name (torch, lightning, ...).
"""
