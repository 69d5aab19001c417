"""Files: writes that a kill or a full disk cannot leave half done, and strict YAML reading.

Everything minitf writes (weights, training state, configs, token caches, pictures) goes through
`atomic_write`: the bytes go to a temporary name in the same directory, then `os.replace` moves
them over the target in one step, so a reader sees the old file or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

from ..errors import ConfigError, MinitfError, first_line


def atomic_write(path: str | Path, write) -> None:
    """Call write(tmp_path), then move tmp_path over path. A failure leaves path untouched.

    A failed write (disk full, read-only or forbidden directory) raises MinitfError naming the
    path and the cause; the temporary file is removed whatever went wrong, Ctrl-C included. The
    file gets the permissions the user's umask gives (some writers create theirs 0600).
    The temporary file is created fresh (O_EXCL) under a unique name, so a link planted at a
    predictable name cannot redirect the bytes; a target that is itself a link, or is not a regular
    file (a FIFO, a device such as /dev/null, a socket), is refused: the rename would replace it.
    """
    path = Path(path)
    refuse_symlink(path)
    refuse_special(path)
    existed = path.is_file()
    kept = "the previous file there is intact" if existed else "nothing was written there"
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:  # e.g. /proc: the file is there, but no new file can be made beside it
        raise _failure(path, e, kept, beside=True) from None
    tmp = None
    try:
        os.close(fd)
        tmp = Path(name)
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        _raise_an_interrupt(e)
        if not _is_write_failure(e):
            raise
        raise _failure(path, e, kept) from None


def atomic_write_dir(path: str | Path, write) -> None:
    """Call write(tmp_dir) on a fresh directory beside `path`, then move what it wrote into place:
    the whole directory by one rename where `path` does not exist, else each file by one rename.
    A failure (disk full, read-only) raises MinitfError naming the path and the cause, and leaves
    nothing behind: no temporary directory, no half-written file, no parent directory it created."""
    path = Path(path)
    existed = path.is_dir()
    made = [p for p in (path.parent, *path.parent.parents) if not p.exists()]  # removed again on failure
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        write(tmp)
        if existed:  # --force: the files written replace theirs, the others there stay
            for f in tmp.iterdir():  # all checked before any is replaced: a refusal changes nothing there
                refuse_symlink(path / f.name)
                refuse_special(path / f.name)
            for f in sorted(tmp.iterdir()):
                os.replace(f, path / f.name)
            tmp.rmdir()
        else:
            os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it 0700
            os.rename(tmp, path)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for p in made:
            with contextlib.suppress(OSError):
                p.rmdir()
        _raise_an_interrupt(e)
        if not _is_write_failure(e):
            raise
        raise _failure(path, e, "the files there are intact" if existed else "nothing was written there") from None


def _failure(path: Path, e: BaseException, kept: str, beside: bool = False) -> MinitfError:
    """The one line for a write that failed: the path, the cause, and what is left of the old file
    (kept). beside: the temporary file itself could not be made next to the path."""
    e = _in_chain(e, OSError) or e  # torch.save's RuntimeError ("unexpected pos ...") over the OSError that caused it
    cause = e.strerror if isinstance(e, OSError) and e.strerror else first_line(e, 160)
    if beside:
        cause = (
            f"no new file can be made in {path.parent} ({cause}), and minitf writes a file beside its "
            f"target first, then renames it: write to another directory"
        )
    return MinitfError(f"could not write {path}: {cause}; {kept}")


def _in_chain(e: BaseException | None, kind: type) -> BaseException | None:
    """The exception of `kind` that e is, or that it was raised while handling (a few links down, at most)."""
    for _ in range(4):
        if e is None or isinstance(e, kind):
            return e
        e = e.__cause__ or e.__context__
    return None


def refuse_symlink(path: Path) -> None:
    """A symbolic link where minitf writes a file of its own is refused: writing would land on
    whatever the link points at (a directory that is itself a link, e.g. runs/x -> /scratch/x, is fine)."""
    if os.path.islink(path):
        raise MinitfError(
            f"{path} is a symbolic link (to {os.readlink(path)}); minitf does not write through links: "
            f"remove it (or move the real file there)"
        )


def special_kind(path: Path) -> str | None:
    """What path is in words when it exists and is not a regular file or a directory ("a FIFO",
    "a character device", ...); None otherwise. A link is judged by what it points at."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing, or a dangling link
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    for test, words in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return words
    return "a special file"


def refuse_special(path: Path, label: str = "") -> None:
    """A FIFO, device or socket where minitf would write a file is refused: renaming a new file over
    it would replace the node (as root, --out /dev/null would replace the machine's /dev/null)."""
    kind = special_kind(path)
    if kind:
        raise MinitfError(
            f"{label}{' ' * bool(label)}{path} is {kind}, not a regular file; minitf replaces regular files only: "
            f"name a file"
        )


def check_out_file(
    path: str | Path,
    force: bool = False,
    ours: Callable[[Path], bool] | None = None,
    label: str = "--out",
    example: str = "out.png",
) -> Path:
    """The one check for a file a user names for minitf to write (a figure, an export, a log), made
    before any work: returns the path, or raises MinitfError in one line naming `label` and the fix.

    Refused whatever force says: a link, a directory (`example` names a file to write inside it),
    a FIFO, device or socket, a path under a file. An existing regular file is replaced only with
    force, or when ours(path) says the same command wrote it (a figure's tag, an export's header),
    so running a command again replaces its own output and never a file it did not write.
    """
    path = Path(path)
    if os.path.islink(path):
        raise MinitfError(f"{label} {path} is a symbolic link; minitf does not write through links: name a file")
    if path.is_dir():
        raise MinitfError(f"{label} {path} is a directory; name the file to write, e.g. {path / example}")
    refuse_special(path, label)
    if any(p.exists() and not p.is_dir() for p in path.parents):
        raise MinitfError(f"{label} {path}: {next(p for p in path.parents if p.exists())} is a file, not a directory")
    if path.exists() and not force and not (ours and ours(path)):
        raise MinitfError(f"{label} {path} already exists; pass --force to replace it, or choose another name")
    return path


def open_nofollow(path: Path, flags: int, mode: int = 0o666) -> int:
    """os.open with O_NOFOLLOW: a symbolic link at path is refused in one line, never followed."""
    try:
        return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), mode)
    except OSError:
        if os.path.islink(path):
            refuse_symlink(path)
        raise


def _raise_an_interrupt(e: BaseException) -> None:
    """Raise the KeyboardInterrupt that e was raised while handling, if any: a second Ctrl-C (the
    one that aborts a stopping run) landing in torch.save's stream write comes out of torch.save as
    RuntimeError("unexpected pos"), which is no failing disk, and the command must say interrupted."""
    interrupt = _in_chain(e, KeyboardInterrupt)
    if interrupt is not None:
        raise interrupt from None


def _is_write_failure(e: BaseException) -> bool:
    """OSError, or what torch.save (RuntimeError from its stream writer) and safetensors
    (SafetensorError) raise when the disk fails them."""
    from safetensors import SafetensorError

    return isinstance(e, (OSError, RuntimeError, SafetensorError))


def current_umask() -> int:
    """The process's umask, which new files and folders honour (atomic_write, fsdp's folders)."""
    try:  # Linux tells it without changing it
        with open("/proc/self/status") as f:
            return int(next(line.split()[1] for line in f if line.startswith("Umask:")), 8)
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


# the largest config file read: every recipe is under 2 KB, a run's config.yaml about 3 KB
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 20  # a config nests two levels (section: key: value)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error, not 'the last wins';
    an alias (*name) is refused before anything is built, so a file of nested aliases (a
    "billion laughs") never expands; and values nested too deep to build, or an integer too long
    to convert, are named in one line, not a traceback."""

    depth = 0  # of the node being composed: PyYAML recurses once per level (RecursionError at ~300)

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise ConfigError(
                f"line {event.start_mark.line + 1} repeats a value with the alias *{event.anchor[:40]}; "
                f"config files take no aliases: write the value out"
            )
        if self.depth >= MAX_CONFIG_DEPTH:
            raise ConfigError(
                f"line {event.start_mark.line + 1} nests lists or mappings more than {MAX_CONFIG_DEPTH} deep; "
                f"a config holds sections of plain settings"
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node):
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            raise ConfigError(
                f"line {node.start_mark.line + 1} holds a number of {len(node.value):,} digits, too long to be "
                f"any setting"
            ) from None

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(
                    f"the key {key!r} appears twice in one section (line {key_node.start_mark.line + 1}); keep one"
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _UniqueKeyLoader.construct_yaml_int)


def read_at_most(path: str | Path, limit: int) -> bytes | None:
    """The file's bytes, or None when it holds more than `limit`: no more than limit + 1 are ever
    read, so a huge file or an endless one (/dev/zero, a pipe) cannot fill the memory. OSError
    (missing, forbidden) is the caller's to word."""
    with open(path, "rb") as f:
        raw = f.read(limit + 1)
    return raw if len(raw) <= limit else None


def read_yaml(path: Path) -> dict:
    """A YAML config file as a dict of sections, or a ConfigError naming the file and the problem.
    At most MAX_CONFIG_BYTES are read: a huge file, or an endless one (a device, a pipe), is refused."""
    path = Path(path)
    if path.is_dir():
        inside = " (e.g. its config.yaml)" if (path / "config.yaml").is_file() else ""
        raise ConfigError(f"config {str(path)!r} is a directory; pass a YAML file{inside}")
    if not path.exists():
        raise ConfigError(
            f"config file {str(path)!r} not found; pass an existing YAML file, e.g. configs/shakespeare.yaml"
        )
    try:
        raw = read_at_most(path, MAX_CONFIG_BYTES)
    except OSError as e:
        raise ConfigError(f"could not read config file {path}: {e.strerror or e}") from None
    if raw is None:
        raise ConfigError(
            f"{path} is larger than {MAX_CONFIG_BYTES:,} bytes, far more than any config (a few KB); "
            f"is it the right file?"
        )
    try:
        d = yaml.load(raw.decode("utf-8"), Loader=_UniqueKeyLoader) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text (byte {e.start}); is it a config file?") from None
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {first_line(e)}") from None
    except RecursionError:
        raise ConfigError(f"{path} is nested too deeply for a config (sections of keys and values)") from None
    if not isinstance(d, dict):
        raise ConfigError(
            f"{path} must hold a mapping of sections (run:, data:, model:, ...), got a {type(d).__name__}"
        )
    return d
