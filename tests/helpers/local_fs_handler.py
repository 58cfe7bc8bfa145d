"""The local filesystem seen through pyarrow's Python filesystem (`pafs.PyFileSystem`): a storage
the product treats as an object store (not a LocalFileSystem), whose reads and writes a test can
make fail or stall. Subclasses override `before_read` / `before_write`."""

from __future__ import annotations

import errno

import pyarrow.fs as pafs


class LocalThroughPython(pafs.FileSystemHandler):
    def __init__(self):
        self.local = pafs.LocalFileSystem()

    def before_read(self, path: str) -> None:
        """Called before a file is opened for reading."""

    def before_write(self, path: str) -> None:
        """Called before a file is written, moved or copied."""

    def get_type_name(self):
        return f"local-through-python-{type(self).__name__}"

    def equals(self, other):
        return self is other

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    __hash__ = object.__hash__

    def normalize_path(self, path):
        return path

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError(errno.EPERM, "not in a test")

    def delete_file(self, path):
        self.local.delete_file(path)

    def move(self, src, dest):
        self.before_write(dest)
        self.local.move(src, dest)

    def copy_file(self, src, dest):
        self.before_write(dest)
        self.local.copy_file(src, dest)

    def open_input_stream(self, path):
        self.before_read(path)
        return self.local.open_input_stream(path)

    def open_input_file(self, path):
        self.before_read(path)
        return self.local.open_input_file(path)

    def open_output_stream(self, path, metadata):
        self.before_write(path)
        return self.local.open_output_stream(path)

    def open_append_stream(self, path, metadata):
        self.before_write(path)
        return self.local.open_append_stream(path)
