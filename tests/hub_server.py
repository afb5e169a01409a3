"""A small stand-in for the Hugging Face Hub on the loopback, so that tests can drive the real clients end to end.

It speaks the part of the Hub's HTTP API that `huggingface_hub` and `transformers` use to create a repo, upload files
in one commit and download them again by branch, tag or commit. Point the clients at it with the environment
variables `HF_ENDPOINT=<hub.url>` and `HF_HUB_DISABLE_XET=1` (the Xet storage protocol is not spoken here: large
files go through the older Git LFS protocol, which the client falls back to).

    with HubServer(users={"alice": "hf_alice_secret"}) as hub:
        subprocess.run([...], env={**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_alice_secret"})

Two servers run on two hosts, as on the real Hub: the Hub itself (`hub.url`, on 127.0.0.1), and a storage server
standing in for its S3 bucket and CDN (`hub.storage_url`, on 127.0.0.2), which receives LFS uploads and serves LFS
downloads through signed URLs handed out by the Hub. Like S3 with a presigned URL, the storage server refuses any request that carries an Authorization header,
so a client that leaked the Hub token to it would fail.

Endpoints of the Hub (TYPE is model, dataset or space; REPO is "namespace/name"; REV is a branch, a tag or a full
commit sha, URL-quoted when it holds a slash):

    GET  /api/whoami-v2
    GET  /api/agent-harnesses                 (asked by the client's telemetry: answered with an empty registry)
    POST /api/repos/create                    {"name", "organization", "visibility" or "private", "type"}
    POST /api/validate-yaml                   checks the YAML front matter of a README
    GET  /api/TYPEs/REPO                      repo info at the main branch (sha, private, siblings)
    GET  /api/TYPEs/REPO/revision/REV         repo info at REV
    GET  /api/TYPEs/REPO/tree/REV[/PATH]      files and folders under PATH; ?recursive=true for the whole subtree
    GET  /api/TYPEs/REPO/refs                 branches and tags
    GET  /api/TYPEs/REPO/commits/REV          history of REV, newest first
    POST /api/TYPEs/REPO/preupload/REV        for each file: upload mode ("regular" or "lfs"), its oid at REV, and
                                              whether .gitignore ignores it (the request's "gitIgnore", else REV's)
    POST /api/TYPEs/REPO/commit/REV           ndjson: a header, then file / lfsFile / deletedFile / deletedFolder lines
    POST /api/TYPEs/REPO/branch/BRANCH        {"startingPoint": REV}, default the main branch
    DELETE /api/TYPEs/REPO/branch/BRANCH
    POST /api/TYPEs/REPO/tag/REV              {"tag": NAME, "message": ...}
    DELETE /api/TYPEs/REPO/tag/TAG
    POST /[TYPEs/]REPO.git/info/lfs/objects/batch    Git LFS batch API, upload operation, "basic" transfer
    POST /[TYPEs/]REPO.git/info/lfs/objects/verify   checks that an uploaded LFS object arrived whole
    HEAD|GET /[TYPEs/]REPO/resolve/REV/PATH   a file: regular files are served directly, LFS files redirect (302)
                                              to a signed storage URL; headers ETag, X-Repo-Commit, Content-Length,
                                              and X-Linked-Etag / X-Linked-Size for LFS files

and of the storage server:

    PUT  /upload/TYPE/REPO/SHA256?signature=...   an LFS object (checked against its sha256 and size)
    HEAD|GET /lfs/TYPE/REPO/SHA256?signature=...  an LFS object

Behaviour that the clients rely on and that follows the real Hub:

* Repos are created with an initial commit holding a `.gitattributes` that sends the usual binary formats
  (`*.safetensors`, `*.bin`, `*.pt`, ...) to LFS. A file is uploaded through LFS if `.gitattributes` says so, if it is
  larger than 10 MB, or if its first 512 bytes contain a NUL byte (binary); the commit endpoint refuses such a file
  sent inline.
* Commit, tree and blob ids are real git object ids (sha1 of the git object), and every commit is a full snapshot,
  so any earlier commit still resolves. A commit is applied atomically: it either moves its branch to the new commit
  or changes nothing. A `parentCommit` that is no longer the branch head fails with 412.
* A file that `.gitignore` ignores is answered `shouldIgnore: true` by the preupload endpoint, and the client leaves
  it out of the commit. The rules are git's: the last matching pattern wins, `!` re-includes, a trailing `/` matches
  folders only, a pattern with a `/` elsewhere is anchored at the root, `**` spans folders, and a file in an ignored
  folder cannot be re-included.
* Tokens: requests carry `Authorization: Bearer <token>`. An unknown token is refused with 401 on every endpoint.
  Writing needs the token of the namespace's user (or of a member of the organization); reading a private repo too.
  A repo that cannot be seen answers 401 to anonymous requests and 404 otherwise, with `X-Error-Code: RepoNotFound`.
* Errors carry `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound) and `X-Error-Message` headers and a JSON
  body `{"error": message}`, which the client turns into its typed exceptions.

Not implemented: pull requests, pagination (every listing fits in one page), `expand` in listings, copies of files
between repos, the Xet protocol and LFS multipart uploads, repo deletion and settings.
"""

import base64
import fnmatch
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import yaml


REPO_TYPES = ("model", "dataset", "space")
URL_PREFIXES = {"model": "", "dataset": "datasets/", "space": "spaces/"}  # before REPO in resolve and LFS URLs
MAX_REGULAR_FILE_SIZE = 10 * 1024 * 1024
DEFAULT_LFS_PATTERNS = """
*.7z *.arrow *.bin *.bz2 *.ckpt *.ftz *.gz *.h5 *.joblib *.lfs.* *.mlmodel *.model *.msgpack *.npy *.npz *.onnx
*.ot *.parquet *.pb *.pickle *.pkl *.pt *.pth *.rar *.safetensors saved_model/**/* *.tar.* *.tar *.tflite *.tgz
*.wasm *.xz *.zip *.zst *tfevents*
""".split()
INITIAL_GITATTRIBUTES = "".join(f"{pattern} filter=lfs diff=lfs merge=lfs -text\n" for pattern in DEFAULT_LFS_PATTERNS)


# --- Git objects -------------------------------------------------------------------------------------------------


def git_object_id(kind: str, body: bytes) -> str:
    """The id git gives an object: sha1 of "<kind> <length>\\0<body>"."""
    return hashlib.sha1(f"{kind} {len(body)}\0".encode() + body).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The small text file git stores in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


# --- .gitignore --------------------------------------------------------------------------------------------------


def gitignore_rules(text: str) -> list[tuple[bool, bool, bool, re.Pattern]]:
    """(negated, anchored, folders only, regex) for each pattern of a .gitignore."""
    rules = []
    for line in text.splitlines():
        pattern = line.rstrip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern.removeprefix("\\")  # "\#", "\!": a literal first character
        folders_only = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        anchored = "/" in pattern
        regex, i = "", 0
        pattern = pattern.lstrip("/")
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("/**", i) and i + 3 == len(pattern):
                regex, i = regex + "/.*", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
                end = pattern.index("]", i + 2)
                members = pattern[i + 1 : end]
                regex, i = regex + "[" + ("^" + members[1:] if members.startswith("!") else members) + "]", end + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        rules.append((negated, anchored, folders_only, re.compile(regex)))
    return rules


def is_ignored(path: str, rules: list, folder: bool = False) -> bool:
    """Whether the rules ignore `path`: a file in an ignored folder is ignored whatever later rules say."""
    parent, _, name = path.rpartition("/")
    if parent and is_ignored(parent, rules, folder=True):
        return True
    ignored = False
    for negated, anchored, folders_only, regex in rules:
        if (folder or not folders_only) and regex.fullmatch(path if anchored else name):
            ignored = not negated
    return ignored


@dataclass(frozen=True)
class FileEntry:
    """One file of a snapshot: inline bytes for a regular file, or the sha256 of an object in LFS storage."""

    size: int
    content: bytes | None = None
    lfs_sha256: str | None = None

    @property
    def oid(self) -> str:
        """The git blob id: of the content, or of the LFS pointer that git stores instead."""
        if self.lfs_sha256 is None:
            return git_object_id("blob", self.content)
        return git_object_id("blob", lfs_pointer(self.lfs_sha256, self.size))


def tree_ids(files: dict[str, FileEntry]) -> dict[str, str]:
    """The git tree id of every folder of a snapshot, the root being ""."""
    ids: dict[str, str] = {}

    def tree(folder: str) -> str:
        prefix = f"{folder}/" if folder else ""
        children: dict[str, FileEntry | None] = {}  # name -> file, or None for a subfolder
        for path, entry in files.items():
            if path.startswith(prefix):
                name, slash, _ = path[len(prefix) :].partition("/")
                children[name] = None if slash else entry
        body = b""
        for name in sorted(children, key=lambda n: n + "/" if children[n] is None else n):  # git's order
            entry = children[name]
            mode, oid = ("40000", tree(prefix + name)) if entry is None else ("100644", entry.oid)
            body += f"{mode} {name}\0".encode() + bytes.fromhex(oid)
        ids[folder] = git_object_id("tree", body)
        return ids[folder]

    tree("")
    return ids


@dataclass
class Commit:
    oid: str
    parent: str | None
    title: str
    description: str
    author: str
    date: str  # ISO 8601, as the Hub writes it
    files: dict[str, FileEntry]


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    created_at: str
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit oid
    tags: dict[str, str] = field(default_factory=dict)
    lfs_objects: dict[str, bytes] = field(default_factory=dict)  # sha256 -> content

    @property
    def namespace(self) -> str:
        return self.repo_id.split("/")[0]


class HubError(Exception):
    """An error answer: HTTP status, message, and the X-Error-Code the client dispatches on."""

    def __init__(self, status: int, message: str, error_code: str | None = None, headers: dict | None = None, **body):
        super().__init__(message)
        self.status, self.message, self.error_code, self.headers = status, message, error_code, headers or {}
        self.body = {"error": message, **body}


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


# --- The Hub's state and operations, without HTTP --------------------------------------------------------------------


class Hub:
    """Users, repos and LFS storage; every method that changes state holds the lock for its whole duration."""

    def __init__(self, users: dict[str, str], orgs: dict[str, list[str]] | None = None):
        self.tokens = {token: user for user, token in users.items()}  # token -> user name
        self.orgs = orgs or {}  # organization -> member user names
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lock = threading.RLock()
        self.signing_key = secrets.token_bytes(32)  # signs storage URLs
        self.reject_uploads = False  # set to make the storage server refuse LFS uploads (a failing upload)
        self.url = self.storage_url = ""  # set when the servers start

    # Authentication and permissions

    def user_for(self, authorization: str | None) -> str | None:
        """The user a request acts for; None when anonymous; 401 for a token this Hub does not know."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or token.strip() not in self.tokens:
            raise HubError(401, "Invalid credentials in Authorization header")
        return self.tokens[token.strip()]

    def may_write(self, user: str | None, namespace: str) -> bool:
        return user is not None and (user == namespace or user in self.orgs.get(namespace, ()))

    def repo(self, repo_type: str, repo_id: str, user: str | None, write: bool = False) -> Repo:
        """The repo if `user` may read it (or write to it); the Hub hides repos one cannot see."""
        repo = self.repos.get((repo_type, repo_id))
        if repo is None or (repo.private and not self.may_write(user, repo.namespace)):
            status = 401 if user is None else 404
            raise HubError(status, f"Repository not found: {repo_type} {repo_id}", "RepoNotFound")
        if write and not self.may_write(user, repo.namespace):
            status = 401 if user is None else 403
            raise HubError(status, f"You don't have the rights to write to {repo_type} {repo_id}")
        return repo

    # Revisions

    def resolve(self, repo: Repo, revision: str) -> Commit:
        """The commit of a branch, a tag (also as refs/heads/..., refs/tags/...) or a full commit sha."""
        revision = revision.removeprefix("refs/heads/")
        if revision.startswith("refs/tags/"):
            oid = repo.tags.get(revision.removeprefix("refs/tags/"))
        else:
            oid = repo.branches.get(revision) or repo.tags.get(revision)
            oid = oid or (revision if revision in repo.commits else None)  # a commit sha
        if oid is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return repo.commits[oid]

    def lfs_patterns(self, files: dict[str, FileEntry]) -> list[str]:
        """The patterns that `.gitattributes` of a snapshot sends to LFS."""
        gitattributes = files.get(".gitattributes")
        if gitattributes is None or gitattributes.content is None:
            return []
        lines = (line.split() for line in gitattributes.content.decode("utf-8", "replace").splitlines())
        return [words[0] for words in lines if len(words) > 1 and "filter=lfs" in words[1:]]

    def must_use_lfs(self, path: str, size: int, sample: bytes, files: dict[str, FileEntry]) -> bool:
        """The Hub's rule: LFS for what `.gitattributes` lists, for large files and for binary files."""
        name = path.rsplit("/", 1)[-1]
        listed = any(
            fnmatch.fnmatch(path if "/" in pattern else name, pattern) for pattern in self.lfs_patterns(files)
        )
        return listed or size > MAX_REGULAR_FILE_SIZE or b"\0" in sample[:512]

    # Writing

    def create_repo(self, user: str | None, repo_type: str, namespace: str, name: str, private: bool) -> Repo:
        if user is None:
            raise HubError(401, "You must be authenticated to create a repo")
        if not re.fullmatch(r"[\w.\-]{1,96}", name) or name.endswith((".git", ".")):
            raise HubError(400, f"Invalid repo name: {name!r}")
        repo_id = f"{namespace}/{name}"
        if not self.may_write(user, namespace):
            raise HubError(403, f"You don't have the rights to create a repo under the namespace {namespace!r}")
        with self.lock:
            if (repo_type, repo_id) in self.repos:  # the client reads the url of the repo from the answer
                existing = f"{self.url}/{URL_PREFIXES[repo_type]}{repo_id}"
                raise HubError(409, f"You already created this {repo_type} repo", url=existing)
            repo = Repo(repo_type, repo_id, private, created_at=now_iso())
            gitattributes = INITIAL_GITATTRIBUTES.encode()
            initial = {".gitattributes": FileEntry(size=len(gitattributes), content=gitattributes)}
            self.add_commit(repo, "main", None, initial, "initial commit", "", user)
            self.repos[(repo_type, repo_id)] = repo
            return repo

    def add_commit(
        self,
        repo: Repo,
        branch: str,
        parent: str | None,
        files: dict[str, FileEntry],
        title: str,
        description: str,
        author: str,
    ) -> Commit:
        """Record a snapshot as a new commit and move `branch` to it (the caller holds the lock)."""
        date, timestamp = now_iso(), int(time.time())
        body = f"tree {tree_ids(files)['']}\n" + (f"parent {parent}\n" if parent else "")
        body += f"author {author} <{author}@users.noreply.hub> {timestamp} +0000\n"
        body += f"committer {author} <{author}@users.noreply.hub> {timestamp} +0000\n\n{title}\n"
        body += f"\n{description}\n" if description else ""
        commit = Commit(git_object_id("commit", body.encode()), parent, title, description, author, date, dict(files))
        repo.commits[commit.oid] = commit
        repo.branches[branch] = commit.oid
        return commit

    def commit(self, repo: Repo, branch: str, lines: list[dict], author: str) -> Commit:
        """Apply the commit endpoint's ndjson lines to the head of `branch`, all or nothing."""
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "The first line of a commit must be its header")
        header = lines[0]["value"]
        title = (header.get("summary") or "").strip()
        if not title:
            raise HubError(400, "A commit needs a summary (its title)")
        with self.lock:
            if branch not in repo.branches:
                if branch in repo.tags or branch in repo.commits:
                    raise HubError(400, f"Can only commit to a branch, and {branch!r} is not one")
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            head = repo.commits[repo.branches[branch]]
            parent = header.get("parentCommit")
            if parent is not None and parent != head.oid:
                raise HubError(412, f"A commit has happened since {parent}. Please refresh and try again.")
            files = dict(head.files)
            for line in lines[1:]:
                self.apply_operation(repo, files, line.get("key"), line.get("value") or {})
            return self.add_commit(repo, branch, head.oid, files, title, header.get("description") or "", author)

    def apply_operation(self, repo: Repo, files: dict[str, FileEntry], key: str, value: dict) -> None:
        path = value.get("path", "")
        if not path or path.startswith("/") or ".." in path.split("/"):
            raise HubError(400, f"Invalid path in commit: {path!r}")
        if key == "file":
            if value.get("encoding") != "base64":
                raise HubError(400, f"Unsupported encoding for {path}: {value.get('encoding')!r}")
            content = base64.b64decode(value["content"])
            if content and self.must_use_lfs(path, len(content), content[:512], files):  # empty files may be inline
                raise HubError(
                    400,
                    f"Your push was rejected because {path} must be stored with LFS (binary, large, "
                    "or listed in .gitattributes)",
                )
            files[path] = FileEntry(size=len(content), content=content)
        elif key == "lfsFile":
            sha256 = value.get("oid", "")
            if value.get("algo", "sha256") != "sha256" or sha256 not in repo.lfs_objects:
                raise HubError(
                    422, f"Your push was rejected because the LFS object of {path} ({sha256}) was never uploaded"
                )
            files[path] = FileEntry(size=len(repo.lfs_objects[sha256]), lfs_sha256=sha256)
        elif key == "deletedFile":
            if path not in files:
                raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
            del files[path]
        elif key == "deletedFolder":
            inside = [p for p in files if p.startswith(path.rstrip("/") + "/")]
            if not inside:
                raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
            for p in inside:
                del files[p]
        else:
            raise HubError(400, f"Unsupported commit operation: {key!r}")

    def create_branch(self, repo: Repo, branch: str, starting_point: str) -> None:
        with self.lock:
            if branch in repo.branches:
                raise HubError(409, f"Branch {branch} already exists")
            if not branch or branch.startswith("refs/") or re.fullmatch(r"[0-9a-f]{40}", branch):
                raise HubError(400, f"Invalid branch name: {branch!r}")
            repo.branches[branch] = self.resolve(repo, starting_point).oid

    def create_tag(self, repo: Repo, revision: str, tag: str) -> None:
        with self.lock:
            if tag in repo.tags:
                raise HubError(409, f"Tag {tag} already exists")
            if not tag or tag.startswith("refs/") or "/" in tag:
                raise HubError(400, f"Invalid tag name: {tag!r}")
            repo.tags[tag] = self.resolve(repo, revision).oid

    def store_lfs_object(self, repo: Repo, sha256: str, content: bytes) -> None:
        with self.lock:
            repo.lfs_objects[sha256] = content

    # Signed storage URLs

    def sign(self, *parts: str) -> str:
        return hmac.new(self.signing_key, "\n".join(parts).encode(), hashlib.sha256).hexdigest()

    def storage_link(self, action: str, repo: Repo, sha256: str, size: int) -> str:
        signature = self.sign(action, repo.repo_type, repo.repo_id, sha256, str(size))
        return (
            f"{self.storage_url}/{action}/{repo.repo_type}/{repo.repo_id}/{sha256}?size={size}&signature={signature}"
        )


# --- HTTP --------------------------------------------------------------------------------------------------------


class _BaseHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive: every request body is read whole and every answer has a Content-Length."""

    protocol_version = "HTTP/1.1"
    timeout = 60  # an idle keep-alive connection is closed after this many seconds
    routes: list[tuple[str, re.Pattern, str]] = []  # (method, pattern on the raw path, handler method name)

    @property
    def hub(self) -> Hub:
        return self.server.hub

    def log_message(self, format, *args):  # keep the test output clean; `hub.requests` keeps a trace
        pass

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()  # the CRLF after each chunk
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def handle_request(self, method: str) -> None:
        url = urlsplit(self.path)
        self.query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        self.body = self.read_body()
        status = 500
        try:
            for route_method, pattern, name in self.routes:
                match = pattern.fullmatch(url.path)
                if match and route_method == ("GET" if method == "HEAD" else method):
                    params = {key: unquote(value) for key, value in match.groupdict().items() if value is not None}
                    status = getattr(self, name)(**params)
                    break
            else:
                raise HubError(404, f"Not found: {method} {url.path}")
        except HubError as error:
            status = error.status
            headers = {"X-Error-Message": error.message.encode("ascii", "replace").decode(), **error.headers}
            if error.error_code:
                headers["X-Error-Code"] = error.error_code
            self.send(status, error.body, headers)
        except Exception as error:  # a bug here must show up in the client as a server error, not as a hang
            self.send(500, {"error": f"{type(error).__name__}: {error}"})
        finally:
            self.server.hub_requests.append(f"{method} {url.path} {status}")

    def do_GET(self):
        self.handle_request("GET")

    def do_HEAD(self):
        self.handle_request("HEAD")

    def do_POST(self):
        self.handle_request("POST")

    def do_PUT(self):
        self.handle_request("PUT")

    def do_DELETE(self):
        self.handle_request("DELETE")

    def send(self, status: int, body: bytes | dict | list | None = None, headers: dict | None = None) -> int:
        """Answer; a dict or list body is sent as JSON. HEAD answers carry the headers of the GET answer only."""
        if isinstance(body, (dict, list)):
            body, content_type = json.dumps(body).encode(), "application/json; charset=utf-8"
        else:
            body, content_type = body or b"", "application/octet-stream"
        self.send_response(status)
        headers = {"Content-Type": content_type, "Content-Length": str(len(body)), **(headers or {})}
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return status

    def send_file_bytes(self, content: bytes, headers: dict) -> int:
        """A file's bytes, or the part a `Range: bytes=START-[END]` header asks for."""
        requested = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if requested is None:
            return self.send(200, content, {"Accept-Ranges": "bytes", **headers})
        start = int(requested.group(1))
        end = min(int(requested.group(2) or len(content) - 1), len(content) - 1)
        if start >= len(content):
            return self.send(416, b"", {"Content-Range": f"bytes */{len(content)}", **headers})
        content_range = f"bytes {start}-{end}/{len(content)}"
        return self.send(206, content[start : end + 1], {"Content-Range": content_range, **headers})


TYPE = r"(?P<kind>models|datasets|spaces)"
REPO = r"(?P<repo>[^/]+/[^/]+?)"
URL_PREFIX = r"(?:(?P<prefix>datasets|spaces)/)?"


def _route(method: str, pattern: str, name: str) -> tuple[str, re.Pattern, str]:
    return method, re.compile(pattern), name


class _HubHandler(_BaseHandler):
    routes = [
        _route("GET", r"/api/whoami-v2", "whoami"),
        _route("GET", r"/api/agent-harnesses", "agent_harnesses"),
        _route("POST", r"/api/repos/create", "create_repo"),
        _route("POST", r"/api/validate-yaml", "validate_yaml"),
        _route("GET", rf"/api/{TYPE}/{REPO}(?:/revision/(?P<revision>[^/]+))?", "repo_info"),
        _route("GET", rf"/api/{TYPE}/{REPO}/tree/(?P<revision>[^/]+)(?:/(?P<path>.+))?", "tree"),
        _route("GET", rf"/api/{TYPE}/{REPO}/refs", "refs"),
        _route("GET", rf"/api/{TYPE}/{REPO}/commits/(?P<revision>[^/]+)", "commits"),
        _route("POST", rf"/api/{TYPE}/{REPO}/preupload/(?P<revision>[^/]+)", "preupload"),
        _route("POST", rf"/api/{TYPE}/{REPO}/commit/(?P<revision>[^/]+)", "commit"),
        _route("POST", rf"/api/{TYPE}/{REPO}/branch/(?P<branch>[^/]+)", "create_branch"),
        _route("DELETE", rf"/api/{TYPE}/{REPO}/branch/(?P<branch>[^/]+)", "delete_branch"),
        _route("POST", rf"/api/{TYPE}/{REPO}/tag/(?P<revision>[^/]+)", "create_tag"),
        _route("DELETE", rf"/api/{TYPE}/{REPO}/tag/(?P<tag>[^/]+)", "delete_tag"),
        _route("POST", rf"/{URL_PREFIX}{REPO}\.git/info/lfs/objects/batch", "lfs_batch"),
        _route("POST", rf"/{URL_PREFIX}{REPO}\.git/info/lfs/objects/verify", "lfs_verify"),
        _route("GET", rf"/{URL_PREFIX}{REPO}/resolve/(?P<revision>[^/]+)/(?P<path>.+)", "resolve"),
    ]

    # Helpers

    @property
    def user(self) -> str | None:
        return self.hub.user_for(self.headers.get("Authorization"))

    def json_body(self) -> dict:
        try:
            return json.loads(self.body or b"{}")
        except json.JSONDecodeError as error:
            raise HubError(400, f"Invalid JSON body: {error}") from None

    def get_repo(
        self, kind: str | None = None, repo: str = "", prefix: str | None = None, write: bool = False
    ) -> Repo:
        """The repo of an /api/{kind}/REPO URL, or of a /[{prefix}/]REPO URL (resolve, LFS)."""
        repo_type = kind[:-1] if kind else {"datasets": "dataset", "spaces": "space"}.get(prefix, "model")
        return self.hub.repo(repo_type, repo, self.user, write=write)

    def repo_url(self, repo: Repo) -> str:
        return f"{self.hub.url}/{URL_PREFIXES[repo.repo_type]}{repo.repo_id}"

    # Account and repos

    def whoami(self) -> int:
        user = self.user
        if user is None:
            raise HubError(401, "You must be authenticated")
        orgs = [{"name": org, "type": "org"} for org, members in self.hub.orgs.items() if user in members]
        token = {"displayName": f"{user}-token", "role": "write"}
        return self.send(
            200,
            {
                "type": "user",
                "name": user,
                "fullname": user,
                "orgs": orgs,
                "auth": {"type": "access_token", "accessToken": token},
            },
        )

    def agent_harnesses(self) -> int:
        """The client's best-effort telemetry asks which AI agents exist; none here."""
        return self.send(200, {"standardEnvVars": [], "harnesses": {}})

    def create_repo(self) -> int:
        body = self.json_body()
        repo_type = body.get("type") or "model"
        if repo_type not in REPO_TYPES:
            raise HubError(400, f"Invalid repo type: {repo_type!r}")
        user = self.user
        namespace = body.get("organization") or user
        private = body.get("visibility", "private" if body.get("private") else "public") != "public"
        repo = self.hub.create_repo(user, repo_type, str(namespace), str(body.get("name")), private)
        return self.send(200, {"url": self.repo_url(repo), "name": repo.repo_id, "id": repo.repo_id})

    def validate_yaml(self) -> int:
        _ = self.user  # refuses an unknown token
        content = self.json_body().get("content", "")
        front_matter = re.match(r"---\r?\n(.*?)\r?\n---\r?\n", content, re.DOTALL)
        if front_matter:
            try:
                metadata = yaml.safe_load(front_matter.group(1))
            except yaml.YAMLError as error:
                return self.send(400, {"errors": [{"message": f"Invalid YAML in the metadata: {error}"}]})
            if metadata is not None and not isinstance(metadata, dict):
                return self.send(400, {"errors": [{"message": "The metadata must be a YAML mapping"}]})
        return self.send(200, {"errors": [], "warnings": []})

    def repo_info(self, kind: str, repo: str, revision: str = "main") -> int:
        repo = self.get_repo(kind, repo)
        commit = self.hub.resolve(repo, revision)
        with_blobs = self.query.get("blobs", "").lower() in ("1", "true")
        siblings = [
            self.describe_file(path, entry, "rfilename") if with_blobs else {"rfilename": path}
            for path, entry in sorted(commit.files.items())
        ]
        return self.send(
            200,
            {
                "_id": repo.repo_id,
                "id": repo.repo_id,
                "author": repo.namespace,
                "sha": commit.oid,
                "private": repo.private,
                "gated": False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "createdAt": repo.created_at,
                "lastModified": commit.date,
                "siblings": siblings,
            },
        )

    @staticmethod
    def describe_file(path: str, entry: FileEntry, path_key: str = "path") -> dict:
        """A file as tree listings (`path`) and repo info with blobs (`rfilename`) describe it."""
        description = {"type": "file", path_key: path, "size": entry.size, "oid": entry.oid, "blobId": entry.oid}
        if entry.lfs_sha256 is not None:
            pointer_size = len(lfs_pointer(entry.lfs_sha256, entry.size))
            description["lfs"] = {
                "oid": entry.lfs_sha256,
                "sha256": entry.lfs_sha256,
                "size": entry.size,
                "pointerSize": pointer_size,
            }
        return description

    # Reading

    def tree(self, kind: str, repo: str, revision: str, path: str = "") -> int:
        repo = self.get_repo(kind, repo)
        commit = self.hub.resolve(repo, revision)
        recursive = self.query.get("recursive", "").lower() in ("1", "true")
        folders = tree_ids(commit.files)
        path = path.strip("/")
        if path and path not in folders:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        prefix = f"{path}/" if path else ""
        entries = []
        for folder in sorted(folders):
            relative = folder[len(prefix) :] if folder.startswith(prefix) else None  # "" for the listed folder
            if relative and (recursive or "/" not in relative):
                entries.append({"type": "directory", "oid": folders[folder], "size": 0, "path": folder})
        for file_path, entry in sorted(commit.files.items()):
            relative = file_path[len(prefix) :] if file_path.startswith(prefix) else None
            if relative and (recursive or "/" not in relative):
                entries.append(self.describe_file(file_path, entry))
        return self.send(200, entries)

    def refs(self, kind: str, repo: str) -> int:
        repo = self.get_repo(kind, repo)

        def listing(refs: dict[str, str], kind: str) -> list[dict]:
            return [
                {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": oid} for name, oid in sorted(refs.items())
            ]

        return self.send(
            200,
            {
                "branches": listing(repo.branches, "heads"),
                "tags": listing(repo.tags, "tags"),
                "converts": [],
                "pullRequests": [],
            },
        )

    def commits(self, kind: str, repo: str, revision: str) -> int:
        repo = self.get_repo(kind, repo)
        commit, history = self.hub.resolve(repo, revision), []
        while commit is not None:
            history.append(
                {
                    "id": commit.oid,
                    "title": commit.title,
                    "message": commit.description,
                    "authors": [{"user": commit.author}],
                    "date": commit.date,
                }
            )
            commit = repo.commits.get(commit.parent) if commit.parent else None
        return self.send(200, history)

    def resolve(self, revision: str, path: str, repo: str, prefix: str | None = None) -> int:
        repo = self.get_repo(repo=repo, prefix=prefix)
        commit = self.hub.resolve(repo, revision)
        entry = commit.files.get(path)
        if entry is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{entry.oid}"'}
        if entry.lfs_sha256 is None:
            return self.send_file_bytes(entry.content, headers)
        location = self.hub.storage_link("lfs", repo, entry.lfs_sha256, entry.size)
        headers["Location"] = location
        headers["X-Linked-Etag"], headers["X-Linked-Size"] = f'"{entry.lfs_sha256}"', str(entry.size)
        return self.send(302, b"", headers)

    # Writing

    def preupload(self, kind: str, repo: str, revision: str) -> int:
        repo = self.get_repo(kind, repo, write=True)
        files = self.hub.resolve(repo, revision).files  # of the commit the client's commit will build on
        body = self.json_body()
        gitignore = body.get("gitIgnore")  # the client sends the .gitignore that its commit adds
        if gitignore is None and files.get(".gitignore") is not None and files[".gitignore"].content is not None:
            gitignore = files[".gitignore"].content.decode("utf-8", "replace")
        rules = gitignore_rules(gitignore or "")
        answers = []
        for file in body.get("files", []):
            sample = base64.b64decode(file.get("sample", ""))
            lfs = self.hub.must_use_lfs(file["path"], int(file["size"]), sample, files)
            existing = files.get(file["path"])
            # The oid the client compares its local file with: sha256 for LFS files, git blob sha1 for the others.
            oid = None if existing is None else existing.lfs_sha256 or existing.oid
            answers.append(
                {
                    "path": file["path"],
                    "uploadMode": "lfs" if lfs else "regular",
                    "shouldIgnore": is_ignored(file["path"], rules),
                    "oid": oid,
                }
            )
        return self.send(200, {"files": answers})

    def commit(self, kind: str, repo: str, revision: str) -> int:
        repo = self.get_repo(kind, repo, write=True)
        if self.query.get("create_pr") in ("1", "true"):
            raise HubError(400, "This test Hub does not support pull requests")
        try:
            lines = [json.loads(line) for line in self.body.splitlines() if line.strip()]
        except json.JSONDecodeError as error:
            raise HubError(400, f"Invalid ndjson commit payload: {error}") from None
        commit = self.hub.commit(repo, revision, lines, self.user)
        return self.send(
            200,
            {
                "success": True,
                "commitOid": commit.oid,
                "commitUrl": f"{self.repo_url(repo)}/commit/{commit.oid}",
                "hookOutput": "",
            },
        )

    def create_branch(self, kind: str, repo: str, branch: str) -> int:
        repo = self.get_repo(kind, repo, write=True)
        self.hub.create_branch(repo, branch, self.json_body().get("startingPoint") or "main")
        return self.send(200, {})

    def delete_branch(self, kind: str, repo: str, branch: str) -> int:
        repo = self.get_repo(kind, repo, write=True)
        with self.hub.lock:
            if branch == "main" or branch not in repo.branches:
                raise HubError(400 if branch == "main" else 404, f"Cannot delete branch {branch}")
            del repo.branches[branch]
        return self.send(200, {})

    def create_tag(self, kind: str, repo: str, revision: str) -> int:
        repo = self.get_repo(kind, repo, write=True)
        self.hub.create_tag(repo, revision, self.json_body().get("tag", ""))
        return self.send(200, {})

    def delete_tag(self, kind: str, repo: str, tag: str) -> int:
        repo = self.get_repo(kind, repo, write=True)
        with self.hub.lock:
            if repo.tags.pop(tag, None) is None:
                raise HubError(404, f"Tag {tag} does not exist")
        return self.send(200, {})

    # Git LFS

    def lfs_batch(self, repo: str, prefix: str | None = None) -> int:
        repo = self.get_repo(repo=repo, prefix=prefix, write=True)
        body = self.json_body()
        if body.get("operation") != "upload":
            raise HubError(400, "Only the upload operation of the LFS batch API is supported")
        if "basic" not in body.get("transfers", ["basic"]):
            raise HubError(400, "Only the basic LFS transfer is supported")
        objects = []
        for obj in body.get("objects", []):
            sha256, size = obj.get("oid", ""), obj.get("size")
            if not re.fullmatch(r"[0-9a-f]{64}", sha256) or not isinstance(size, int) or size < 0:
                objects.append(
                    {
                        "oid": str(sha256),
                        "size": size if isinstance(size, int) else 0,
                        "error": {"code": 422, "message": "Invalid oid or size"},
                    }
                )
                continue
            answer = {"oid": sha256, "size": size, "authenticated": True}
            if sha256 not in repo.lfs_objects:  # otherwise already stored: no actions, nothing to upload
                verify = f"{self.repo_url(repo)}.git/info/lfs/objects/verify"
                answer["actions"] = {
                    "upload": {"href": self.hub.storage_link("upload", repo, sha256, size)},
                    "verify": {"href": verify},
                }
            objects.append(answer)
        return self.send(
            200,
            {"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
            {"Content-Type": "application/vnd.git-lfs+json"},
        )

    def lfs_verify(self, repo: str, prefix: str | None = None) -> int:
        repo = self.get_repo(repo=repo, prefix=prefix, write=True)
        body = self.json_body()
        content = repo.lfs_objects.get(body.get("oid", ""))
        if content is None or len(content) != body.get("size"):
            raise HubError(404, f"LFS object {body.get('oid')} was not uploaded whole")
        return self.send(200, {"message": "Object verified"})


class _StorageHandler(_BaseHandler):
    """The storage behind the Hub: signed PUT of uploads and GET of LFS files, no credentials accepted."""

    routes = [
        _route("PUT", rf"/upload/(?P<repo_type>model|dataset|space)/{REPO}/(?P<sha256>[0-9a-f]{{64}})", "upload"),
        _route("GET", rf"/lfs/(?P<repo_type>model|dataset|space)/{REPO}/(?P<sha256>[0-9a-f]{{64}})", "download"),
    ]

    def check_signature(self, action: str, repo_type: str, repo: str, sha256: str) -> Repo:
        if self.headers.get("Authorization"):
            raise HubError(400, "Only one auth mechanism allowed: this URL is signed, send no Authorization header")
        size = self.query.get("size", "")
        expected = self.hub.sign(action, repo_type, repo, sha256, size)
        if not hmac.compare_digest(expected, self.query.get("signature", "")):
            raise HubError(403, "Signature does not match")
        stored = self.hub.repos.get((repo_type, repo))
        if stored is None:
            raise HubError(404, "No such bucket")
        return stored

    def upload(self, repo_type: str, repo: str, sha256: str) -> int:
        stored = self.check_signature("upload", repo_type, repo, sha256)
        if self.hub.reject_uploads:
            raise HubError(403, "Request has expired")
        if len(self.body) != int(self.query["size"]) or hashlib.sha256(self.body).hexdigest() != sha256:
            raise HubError(400, "The uploaded content does not match its sha256 and size")
        self.hub.store_lfs_object(stored, sha256, self.body)
        return self.send(200, b"", {"ETag": f'"{hashlib.md5(self.body).hexdigest()}"'})

    def download(self, repo_type: str, repo: str, sha256: str) -> int:
        stored = self.check_signature("lfs", repo_type, repo, sha256)
        content = stored.lfs_objects.get(sha256)
        if content is None:
            raise HubError(404, "No such key")
        return self.send_file_bytes(content, {"ETag": f'"{sha256}"'})


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: Hub, handler: type[_BaseHandler], host: str):
        super().__init__((host, 0), handler)  # port 0: the system picks a free port
        self.hub = hub
        self.hub_requests = []


class HubServer:
    """Run a `Hub` on 127.0.0.1 and its storage on 127.0.0.2 (free ports, background threads) for the duration of a
    `with` block. Two hosts, as the Hub and its CDN are: a client must not send its token to the storage's signed URLs.

    Args:
        users: user name -> the token that authenticates it.
        orgs: organization name -> names of its members, who may write to it.

    Attributes:
        url: the endpoint to give the clients (HF_ENDPOINT).
        storage_url: the storage server's address (LFS uploads and downloads go there).
        hub: the state, for tests to inspect (`hub.repos`) or to make uploads fail (`hub.reject_uploads = True`).
    """

    def __init__(self, users: dict[str, str], orgs: dict[str, list[str]] | None = None):
        self.hub = Hub(users, orgs)
        self._servers = [_Server(self.hub, _HubHandler, "127.0.0.1"), _Server(self.hub, _StorageHandler, "127.0.0.2")]
        self.url = self.hub.url = f"http://127.0.0.1:{self._servers[0].server_port}"
        self.storage_url = self.hub.storage_url = f"http://127.0.0.2:{self._servers[1].server_port}"
        self._threads = [threading.Thread(target=server.serve_forever, daemon=True) for server in self._servers]

    @property
    def requests(self) -> list[str]:
        """ "METHOD path status" of every request served so far, Hub and storage, for debugging (never headers)."""
        return [*self._servers[0].hub_requests, *self._servers[1].hub_requests]

    def client_env(self, home, token: str | None = None) -> dict:
        """The environment of a client process of this Hub: no Xet, its own HF_HOME (`home`), `token` as HF_TOKEN
        (none: anonymous), no Hub settings inherited."""
        env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGINGFACE_"))}
        env.update(
            HF_ENDPOINT=self.url,
            HF_HUB_DISABLE_XET="1",
            HF_HOME=str(home),
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            NO_PROXY="127.0.0.1",
            no_proxy="127.0.0.1",
        )
        if token is not None:
            env["HF_TOKEN"] = token
        return env

    def start(self) -> "HubServer":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=10)

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
