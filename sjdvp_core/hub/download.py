"""Download a catalogue entry (sjdvp_core.hub.catalogue) from the Hugging Face Hub into a models
folder, resumably and verified, with huggingface_hub's client (endpoint, token, errors, file
listing).

    python -m sjdvp_core.download --list
    python -m sjdvp_core.download Janus-Pro-1B --dir ComfyUI/models/sjdvp

How a folder is never taken for a complete model: a marker file (models.folders.marker:
.sjdvp-download.json, or .sjdvp-download.<file>.json for an entry whose model is one file in a
shared folder) is written into the entry's folder before anything else and removed only after every
file is in place and verified; the registry does not list, and the loader refuses, the model it
marks. How a download resumes: each file is fetched into `<file>.part` with HTTP range requests
(kept when the run stops: interrupt, lost connection, closed app), files already verified are
recorded in the marker and skipped, and a dropped connection is resumed a few times within the run.
How files are verified: size, then the Hub's sha256 (LFS files) or git blob hash (small files), and
any MD5 the catalogue pins; a mismatch deletes the part and says so. Progress and interrupts reach
the caller through `progress(done_bytes, total_bytes)`, which may raise to stop (the part files stay
for the next run).

Why the transfer is hand-written (checked against huggingface_hub 2.4): hf_hub_download(local_dir=)
and snapshot_download fetch into a uniquely named temporary file that they delete on any exception
(file_download._download_to_tmp_and_move), so Cancel or a closed app loses the file's bytes; they
check the size, not the content's hash; they write .cache/huggingface/ into the model's folder; and
they cannot drop a leading folder (Source.strip). Their inner http_get keeps a part file and takes a
tqdm_class, but retries no connection reset (httpx ReadError), hears Cancel only every 10 MB
(constants.DOWNLOAD_CHUNK_SIZE), is not documented API, and took more code here than this loop.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from ..cli.mistakes import run_command
from ..models.folders import incomplete, marker, read_marker, unfinished_marker
from .catalogue import ENTRIES, Entry, Source, describe, find, size_text

CHUNK = 1 << 20
RETRIES = 3
LOCK_POLL = (
    0.5  # seconds between two looks at the progress call while another process downloads the entry
)
log = logging.getLogger("sjdvp")
Progress = Callable[[int, int], None]
PROG = "python -m sjdvp_core.download"


class DownloadError(RuntimeError):
    """A download that cannot go on, with what to do about it; resumable: trying again later may
    finish it (the message then says where the part already fetched is kept, if any is)."""

    def __init__(self, message: str, resumable: bool = False):
        super().__init__(message)
        self.resumable = resumable


AGAIN = "download it again (choose the model again in ComfyUI, or run the same command)"


def on_disk(entry: Entry, roots: list[str]) -> str | None:
    """The entry's full path under the first root that holds it complete, else None."""
    for root in roots:
        path = os.path.join(root, entry.path)
        if _present(path) and unfinished_marker(path) is None:
            return path
    return None


def _present(path: str) -> bool:
    """A model file, or a folder with something in it (an empty one is what a failed first try
    left before)."""
    return os.path.isfile(path) or (os.path.isdir(path) and bool(os.listdir(path)))


@dataclass
class Planned:
    source: Source
    remote: str
    local: str
    size: int
    sha256: str | None
    git_sha1: str | None
    commit: str


def _endpoint(endpoint: str | None) -> str:
    from huggingface_hub import constants

    return (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _explain(error: Exception, repo: str, endpoint: str, folder: str) -> DownloadError:
    """huggingface_hub's and httpx's errors -> what the user can do."""
    from huggingface_hub import errors

    if isinstance(error, errors.GatedRepoError):
        return DownloadError(
            f"{repo} is gated: open https://huggingface.co/{repo} while logged in and accept its licence, then "
            "create a read token at https://huggingface.co/settings/tokens and set it as HF_TOKEN (or run "
            "`hf auth login`) before starting ComfyUI or the command.",
            resumable=True,
        )
    if isinstance(error, errors.RepositoryNotFoundError):
        return DownloadError(
            f"{repo} was not found on {endpoint} (renamed, deleted, private, or your HF_TOKEN "
            f"cannot see it). Put its files in {folder} by hand as the pack's docs/models.md says."
        )
    if isinstance(error, errors.RevisionNotFoundError):
        return DownloadError(
            f"{repo}: the revision this version of sjdvp expects is gone; update sjdvp."
        )
    if isinstance(error, errors.RemoteEntryNotFoundError):
        return DownloadError(
            f"{repo}: a file this version of sjdvp expects is gone ({error}); update sjdvp."
        )
    if isinstance(error, errors.OfflineModeIsEnabled):
        return DownloadError(
            f"offline mode is on (HF_HUB_OFFLINE=1), so {repo} cannot be downloaded: unset it, "
            f"or put the files in {folder} by hand (the pack's docs/models.md)."
        )
    if isinstance(error, errors.HfHubHTTPError):
        return DownloadError(
            f"{endpoint} refused {repo}: {str(error).strip().splitlines()[0]}.", resumable=True
        )
    return DownloadError(
        f"cannot reach {endpoint} for {repo} ({type(error).__name__}: {error}). Check the "
        f"connection or proxy (HF_ENDPOINT names a mirror), or put the files in {folder} by hand "
        "(the pack's docs/models.md).",
        resumable=True,
    )


def _httpx():
    """huggingface_hub's HTTP library: httpx2 (2.x, tested with 2.4) or httpx (1.x); 0.x used
    requests."""
    try:
        import httpx2

        return httpx2
    except ImportError:
        try:
            import httpx

            return httpx
        except ImportError:
            raise DownloadError(
                "downloads need huggingface_hub 1.0 or newer: pip install -U huggingface_hub"
            ) from None


def _network_errors() -> tuple[type[BaseException], ...]:
    from huggingface_hub import errors

    return (_httpx().TransportError, errors.HfHubHTTPError, errors.OfflineModeIsEnabled)


def select(src: Source, names, where: str) -> list[str]:
    """The repository files (names) that src's allow patterns take, sorted; a pattern that takes
    none means the repository changed under us (or the catalogue is wrong): refused, before any
    byte."""
    from huggingface_hub.utils import filter_repo_objects

    names = sorted(names)
    for pattern in src.files:
        if not list(filter_repo_objects(names, allow_patterns=[pattern])):
            raise DownloadError(
                f"{where} has no file matching {pattern!r}; this version of sjdvp expects it "
                "there. Update sjdvp, or get the file by hand (the pack's docs/models.md)."
            )
    return list(filter_repo_objects(names, allow_patterns=list(src.files + src.optional)))


def plan(
    entry: Entry, endpoint: str | None = None, token: str | bool | None = None, folder: str = ""
) -> list[Planned]:
    """Every file of the entry with its size and hashes, from the Hub's listing (one request per
    repository)."""
    from huggingface_hub import HfApi, constants

    endpoint = _endpoint(endpoint)
    api = HfApi(endpoint=endpoint, token=token)
    out = []
    for src in entry.sources:
        try:
            if constants.is_offline_mode():
                from huggingface_hub.errors import OfflineModeIsEnabled

                raise OfflineModeIsEnabled("HF_HUB_OFFLINE is set")
            info = api.model_info(src.repo, revision=src.revision, files_metadata=True)
        except _network_errors() as e:
            raise _explain(e, src.repo, endpoint, folder) from e
        files = {s.rfilename: s for s in info.siblings or []}
        for name in select(src, files, f"{src.repo} at {info.sha}"):
            s = files[name]
            out.append(
                Planned(
                    src,
                    name,
                    src.local(name),
                    s.lfs.size if s.lfs else (s.size or 0),
                    s.lfs.sha256 if s.lfs else None,
                    None if s.lfs else s.blob_id,
                    info.sha,
                )
            )
    return out


def _hash_ok(path: str, item: Planned, still: Callable[[], None] = lambda: None) -> str | None:
    """None if the file is the one the Hub lists (and the catalogue pins), else what differs.
    still() is called between blocks and may raise to stop (a multi-GB file takes tens of seconds
    to hash; ComfyUI's Cancel)."""
    size = os.path.getsize(path)
    if size != item.size:
        return f"{size} bytes where the Hub lists {item.size} (a truncated or overlong download)"
    sha256, md5, sha1 = hashlib.sha256(), hashlib.md5(), hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        while block := f.read(CHUNK * 8):
            still()
            sha256.update(block)
            md5.update(block)
            sha1.update(block)
    if item.sha256 and sha256.hexdigest() != item.sha256:
        return f"sha256 {sha256.hexdigest()} where the Hub lists {item.sha256}"
    if item.git_sha1 and sha1.hexdigest() != item.git_sha1:
        return f"git hash {sha1.hexdigest()} where the Hub lists {item.git_sha1}"
    pinned = dict(item.source.md5).get(item.remote)
    if pinned and md5.hexdigest() != pinned:
        return f"MD5 {md5.hexdigest()} where the published checksum is {pinned}"
    return None


class _State:
    """The marker file: which entry, and which files are already verified (name -> hash)."""

    def __init__(self, folder: str, entry: Entry):
        self.path = marker(folder, entry.model)
        self.data = {"entry": entry.name, "done": _done(read_marker(self.path))}
        # an older sjdvp marked a shared folder itself
        older = read_marker(marker(folder)) if entry.model else {}
        adopt = older.get("entry") == entry.name
        if adopt:
            self.data["done"] = {**_done(older), **self.data["done"]}
        self.save()
        if adopt:
            os.remove(marker(folder))

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, self.path)

    def done(self, item: Planned) -> bool:
        return self.data["done"].get(item.local) == (item.sha256 or item.git_sha1)

    def mark(self, item: Planned) -> None:
        self.data["done"][item.local] = item.sha256 or item.git_sha1
        self.save()


def _done(record: dict) -> dict:
    """A marker record's verified files (name -> hash), {} where it holds none readable."""
    done = record.get("done")
    return dict(done) if isinstance(done, dict) else {}


def _fetch(item: Planned, dest: str, endpoint: str, token, report: Callable[[int], None]) -> None:
    """item -> dest + '.part' (resumed from its length) -> verified -> dest."""
    httpx = _httpx()
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    part = dest + ".part"
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    if os.path.exists(part) and os.path.getsize(part) > item.size:
        os.remove(part)
    url = hf_hub_url(item.source.repo, item.remote, revision=item.commit, endpoint=endpoint)
    retries = RETRIES
    while True:
        have = os.path.getsize(part) if os.path.exists(part) else 0
        report(have)
        if have == item.size:
            break
        headers = build_hf_headers(token=token, headers={"Accept-Encoding": "identity"})
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            with get_session().stream(
                "GET",
                url,
                headers=headers,
                follow_redirects=True,
                timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
            ) as r:
                if r.status_code == 416:
                    break  # nothing past what we have: verify says what is wrong
                if r.status_code >= 400:
                    r.read()
                    hf_raise_for_status(r)
                # 200: the server ignored the range
                mode = "ab" if have and r.status_code == 206 else "wb"
                got = have if mode == "ab" else 0
                with open(part, mode) as f:
                    for chunk in r.iter_bytes(CHUNK):
                        f.write(chunk)
                        got += len(chunk)
                        report(got)
            if got >= item.size or got == have:
                break  # complete, or the server sends no more: verify below
        except httpx.TransportError:
            if retries == 0:
                raise
            retries -= 1
            time.sleep(0.5)
    problem = _hash_ok(part, item, lambda: report(item.size))
    if problem:
        os.remove(part)
        raise DownloadError(
            f"{item.source.repo}/{item.remote} did not download correctly: {problem}. The bad copy "
            f"was deleted; {AGAIN} to fetch it afresh."
        )
    os.replace(part, dest)


def still_needed(folder: str, items: list[Planned]) -> int:
    """Bytes the download still has to write: each file not already whole in place, less its part
    file."""
    need = 0
    for item in items:
        dest = os.path.join(folder, item.local)
        if os.path.isfile(dest) and os.path.getsize(dest) == item.size:
            continue  # verified, or there by hand: checked, not re-fetched
        part = dest + ".part"
        need += item.size - (min(os.path.getsize(part), item.size) if os.path.isfile(part) else 0)
    return need


def check_space(entry: Entry, folder: str, items: list[Planned]) -> None:
    """Refuse before the first byte when the disk cannot hold what is left to download."""
    need, free = still_needed(folder, items), shutil.disk_usage(folder).free
    if need > free:
        raise DownloadError(
            f"{entry.name} needs {size_text(need)} ({need:,} bytes) more in {folder}, but only "
            f"{size_text(free)} ({free:,} bytes) is free on that disk. Free some space, or point "
            "models/sjdvp at a larger disk "
            f"(extra_model_paths.yaml in ComfyUI, --dir on the command line), then {AGAIN}: what "
            "is already downloaded is kept."
        )


def download(
    entry: Entry | str,
    root: str,
    progress: Progress | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
) -> str:
    """Download (or resume, or just verify the completeness of) entry into root; returns the
    model's path."""
    if isinstance(entry, str):
        found = find(entry)
        if found is None:
            raise ValueError(
                f"no catalogue entry {entry!r}; entries: {', '.join(e.name for e in ENTRIES)}"
            )
        entry = found
    folder = os.path.join(root, entry.folder)
    path = os.path.join(root, entry.path)
    if _present(path) and unfinished_marker(path) is None:
        return path
    progress = progress or (lambda done, total: None)
    with _one_at_a_time(root, entry, progress):
        if _present(path) and unfinished_marker(path) is None:
            return path  # another process finished it while this one waited
        return _download(entry, folder, path, progress, _endpoint(endpoint), token)


def _download(
    entry: Entry,
    folder: str,
    path: str,
    progress: Progress,
    endpoint: str,
    token: str | bool | None,
) -> str:
    created, above = [], os.path.abspath(folder)  # every folder makedirs makes, deepest first
    while not os.path.isdir(above) and above != os.path.dirname(above):
        created.append(above)
        above = os.path.dirname(above)
    fresh = not incomplete(folder, entry.model)
    try:
        os.makedirs(folder, exist_ok=True)
        state = _State(folder, entry)  # the marker: written before any file
    except (
        OSError
    ) as e:  # a read-only or full models folder: said as every other failed download is
        raise DownloadError(
            f"cannot write in {folder} ({e.strerror}): choose a models folder this user can write, "
            "with room for the model (extra_model_paths.yaml in ComfyUI, --dir on the command "
            "line)"
        ) from e
    try:
        _fetch_all(entry, folder, state, progress, endpoint, token)
    except DownloadError as e:
        if (
            fresh
            and not state.data["done"]
            and not glob.glob(os.path.join(folder, "**", "*.part"), recursive=True)
        ):
            # nothing fetched: unmarked, so files the message says to put there load
            os.remove(state.path)
            for made in created:  # nor left empty, where a folder model would pass for complete
                if not os.listdir(made):
                    os.rmdir(made)
            raise
        if e.resumable:
            raise DownloadError(
                f"{e} What was downloaded so far is kept in {folder}; {AGAIN} to resume."
            ) from e
        raise
    if not os.path.exists(path):
        raise DownloadError(
            f"{entry.name}: downloaded, but {path} is not among its files; update sjdvp"
        )
    os.remove(state.path)  # the model is complete from here on
    return path


@contextlib.contextmanager
def _one_at_a_time(root: str, entry: Entry, progress: Progress):
    """One process at a time downloads an entry into a models folder: two (two ComfyUI instances
    sharing the folder, or ComfyUI and the command) would write the same part files, and one
    would fail on the other's renamed file. The second waits, says once who holds it, and calls
    progress(0, 0) while it waits (Cancel stops the wait; the other download goes on). An OS lock
    (filelock, which torch and huggingface_hub bring), so a process that dies holds nothing; kept
    in the temporary folder, named after the models folder's real path and the entry, so that
    nothing is left in the models folder (a failed first try leaves it as it was)."""
    from filelock import FileLock, Timeout

    key = hashlib.sha256(f"{os.path.realpath(root)}\n{entry.name}".encode()).hexdigest()[:24]
    lock_path = os.path.join(tempfile.gettempdir(), f"sjdvp-download-{key}.lock")
    owner = lock_path + ".owner"
    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = read_marker(owner)
        log.warning(
            "sjdvp: %s is being downloaded into %s by another process (pid %s on %s, since %s); waiting for "
            "it to finish",
            entry.name,
            root,
            holder.get("pid", "?"),
            holder.get("host", "?"),
            holder.get("since", "?"),
        )
        while True:
            progress(0, 0)
            try:
                lock.acquire(timeout=LOCK_POLL)
                break
            except Timeout:
                continue
    try:
        with open(owner, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                },
                f,
            )
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(owner)
        lock.release()


def _fetch_all(
    entry: Entry,
    folder: str,
    state: "_State",
    progress: Progress,
    endpoint: str,
    token: str | bool | None,
) -> None:
    """Every file of the entry into folder, each verified and marked done; files already there
    and right are kept."""
    items = plan(entry, endpoint, token, folder)
    check_space(entry, folder, items)
    total = sum(i.size for i in items)
    finished = 0
    progress(0, total)
    for item in items:
        dest = os.path.join(folder, item.local)
        if state.done(item) and os.path.isfile(dest) and os.path.getsize(dest) == item.size:
            finished += item.size
            progress(finished, total)
            continue
        if os.path.isfile(dest):  # there before us (copied by hand?): keep it if it is right
            if _hash_ok(dest, item, lambda done=finished: progress(done, total)) is None:
                state.mark(item)
                finished += item.size
                progress(finished, total)
                continue
            os.remove(dest)
        try:
            _fetch(item, dest, endpoint, token, lambda n, base=finished: progress(base + n, total))
        except _network_errors() as e:
            raise _explain(e, item.source.repo, endpoint, folder) from e
        state.mark(item)
        finished += item.size


class _TextBar:
    def __init__(self, out=sys.stderr):
        self.out, self.last = out, 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last >= 0.5 or done >= total:
            self.last = now
            if not total:
                return  # waiting for another process's download of it
            pct = 100 * done / total
            print(
                f"\r  {size_text(done)} / {size_text(total)} ({pct:.0f}%)",
                end="",
                file=self.out,
                flush=True,
            )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Download a model of the catalogue (--list) from the Hugging "
        "Face Hub into a models folder, every file verified (size, hash). An interrupted "
        "or failed download resumes when run again.",
    )
    ap.add_argument("name", nargs="?", help="a catalogue entry (see --list)")
    ap.add_argument(
        "--dir",
        default=os.path.join("models", "sjdvp"),
        help="the models/sjdvp folder to download into (default: ./models/sjdvp)",
    )
    ap.add_argument("--list", action="store_true", help="list the catalogue")
    args = ap.parse_args(argv)
    if args.list or not args.name:
        print(describe())
        return 0
    return run_command(PROG, lambda: fetch(args.name, args.dir))


def fetch(name: str, folder: str) -> int:
    """Download with a progress line; a failed download is its message and exit status 1."""
    entry = find(name)
    there = entry is not None and on_disk(entry, [folder]) is not None
    try:
        path = download(entry or name, folder, _TextBar())
    except KeyboardInterrupt:  # said by run_command, as every command's Ctrl-C
        raise KeyboardInterrupt("run the same command again to resume") from None
    except DownloadError as e:
        print(f"\n{e}", file=sys.stderr)
        return 1
    # download() returns a model in place at once: it has no listing to verify it against offline
    if there:
        print(
            f"{path}: already there (downloaded before, or put there by hand), so not fetched or verified again; "
            f"`python -m sjdvp_core.check {path}` says whether it runs"
        )
    else:
        print(f"\n{path}: complete and verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
