/**
 * `LocalDirectory`: a resource driver whose resource is a directory on the
 * local disk, with content-addressed snapshots as checkpoints. It writes the
 * same store, manifests and refs as the Python SDK's driver, byte for byte
 * (docs/protocol/vectors/local-directory.json), so a checkpoint either SDK
 * captured restores in the other.
 *
 *     const workspace = await resource("workspace", { driver: new LocalDirectory() });
 *     await workspace.files.write("notes.txt", "hello");
 *
 * Layout under `root`:
 *
 * | path                              | holds                                  |
 * |-----------------------------------|----------------------------------------|
 * | `workspaces/<uuid>/`              | live directories, one per `create`     |
 * | `store/objects/<2 hex>/<62 hex>`  | file contents by SHA-256, read-only    |
 * | `store/snapshots/<64 hex>.json`   | manifests                              |
 * | `tmp/`                            | staging: written, synced, renamed      |
 *
 * A ref is `sha256:<hex of the manifest bytes>`: an unchanged tree yields the
 * same ref, and identical files are stored once. Restores copy (never link)
 * every object, verifying its hash, so writes in a restored workspace can
 * never change a checkpoint. A malformed ref, a missing or damaged manifest
 * or object, or an entry that would escape the workspace throws
 * `CheckpointUnavailable`. Everything a call writes is fsynced before
 * anything refers to it. A capture re-reads only files whose size, times,
 * inode or mode changed since the handle's last capture.
 *
 * The driver's file system calls are synchronous: a capture blocks the event
 * loop for as long as it takes (milliseconds for a thousand unchanged files).
 */

import { createHash, randomUUID } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { CheckpointUnavailable } from "../errors.js";
import { compareUtf8 } from "../identity.js";
import type { Created, ResourceDriver } from "../resources.js";

export const FORMAT = "rebuno.local_directory.v1";
export const DRIVER_ID = "rebuno.local_directory.v1";
export const ENV_ROOT = "REBUNO_LOCAL_RESOURCES";
const DEFAULT_ROOT = path.join(".rebuno", "resources");

const REF = /^sha256:([0-9a-f]{64})$/;
const HEX = /^[0-9a-f]{64}$/;
const CHUNK = 1 << 20;
/**
 * A file whose times fall this close to a capture's start is hashed again
 * by the next capture: a change within the clock's granularity could leave
 * size and times unchanged.
 */
const RACY_NS = 100_000_000n;
const ENTRY_KEYS: Record<string, string[]> = {
  dir: ["mode", "path", "type"],
  file: ["mode", "path", "sha256", "size", "type"],
  symlink: ["path", "target", "type"],
};
const utf8 = new TextDecoder("utf-8", { fatal: true });

export type ManifestEntry =
  | { mode: number; path: string; type: "dir" }
  | { mode: number; path: string; sha256: string; size: number; type: "file" }
  | { path: string; target: string; type: "symlink" };

/** A snapshot that cannot be restored exactly (turned into CheckpointUnavailable). */
class Damaged extends Error {}

/** One entry as the manifest writes it: keys sorted, no whitespace, non-ASCII raw. */
function entryText(e: ManifestEntry): string {
  switch (e.type) {
    case "dir":
      return JSON.stringify({ mode: e.mode, path: e.path, type: e.type });
    case "file":
      return JSON.stringify({ mode: e.mode, path: e.path, sha256: e.sha256, size: e.size, type: e.type });
    case "symlink":
      return JSON.stringify({ path: e.path, target: e.target, type: e.type });
  }
}

function assemble(parts: [string, string][]): Buffer {
  parts.sort((a, b) => compareUtf8(a[0], b[0]));
  return Buffer.from(`{"entries":[${parts.map(([, text]) => text).join(",")}],"format":${JSON.stringify(FORMAT)}}`, "utf8");
}

/** The manifest of a tree: entries sorted by the UTF-8 bytes of their paths. */
export function manifestBytes(entries: readonly ManifestEntry[]): Buffer {
  return assemble(entries.map((e) => [e.path, entryText(e)]));
}

const sha256 = (data: Uint8Array): string => createHash("sha256").update(data).digest("hex");

function fsyncPath(p: string): void {
  const fd = fs.openSync(p, "r");
  try {
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

/** mkdir -p, fsyncing the parent of each directory it creates. */
function makeDirs(p: string, mode: number): void {
  const parent = path.dirname(p);
  if (parent !== p && !isDir(parent)) makeDirs(parent, 0o777);
  try {
    fs.mkdirSync(p, mode);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "EEXIST" && isDir(p)) return;
    throw e;
  }
  fsyncPath(parent);
}

function isDir(p: string): boolean {
  try {
    return fs.statSync(p).isDirectory();
  } catch {
    return false;
  }
}

function isFile(p: string): boolean {
  try {
    return fs.statSync(p).isFile();
  } catch {
    return false;
  }
}

function decodeName(name: Buffer, where: string): string {
  try {
    return utf8.decode(name);
  } catch {
    throw new Error(`${where}: file name is not valid UTF-8`);
  }
}

// A write goes to a temporary file beside its target, then is renamed over it.
// A crash between the two leaves the temporary file behind; its name says so.
const INTERRUPTED = /^\..+\.[0-9a-f]{32}\.rebuno-tmp$/s;

/** @internal The temporary file a write of `name` in `parent` goes through. */
export function tempPath(parent: string, name: string): string {
  return path.join(parent, `.${name}.${randomUUID().replaceAll("-", "")}.rebuno-tmp`);
}

/**
 * Deletes the temporary files of writes that a crash cut short, so that a
 * reopened workspace holds only files written whole (the write runs again
 * when its step replays). Symlinked directories are not followed. Best
 * effort: a directory it may not read or change keeps what it holds.
 */
function removeInterruptedWrites(dir: string): void {
  let entries: fs.Dirent[];
  try {
    entries = fs.readdirSync(dir, { withFileTypes: true });
  } catch {
    return;
  }
  for (const e of entries) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) removeInterruptedWrites(p);
    else if (INTERRUPTED.test(e.name)) {
      try {
        fs.rmSync(p, { force: true });
      } catch {
        // left as it is, like an unreadable directory
      }
    }
  }
}

function removeTree(p: string): void {
  // A restored mode may have made a directory read-only: open them up first.
  const open = (d: string): void => {
    try {
      fs.chmodSync(d, 0o700);
      for (const e of fs.readdirSync(d, { withFileTypes: true })) if (e.isDirectory()) open(path.join(d, e.name));
    } catch {
      // best effort: rmSync reports what it cannot remove
    }
  };
  if (isDir(p)) open(p);
  fs.rmSync(p, { recursive: true, force: true });
}

/**
 * Resolve `p` below `root` the way `realpath` does, also for paths that do
 * not exist yet (the existing part is resolved, the rest appended).
 */
function resolveInside(root: string, p: string): string {
  if (typeof p !== "string") throw new TypeError(`path must be a string, not ${typeof p}`);
  if (p.includes("\0")) throw new TypeError("path contains NUL");
  const realRoot = fs.realpathSync(root);
  let existing = path.join(realRoot, p.replace(/^\/+/, ""));
  const rest: string[] = [];
  for (;;) {
    try {
      existing = fs.realpathSync(existing);
      break;
    } catch {
      rest.unshift(path.basename(existing));
      existing = path.dirname(existing);
    }
  }
  const real = path.join(existing, ...rest);
  if (real !== realRoot && !real.startsWith(realRoot + path.sep)) {
    throw Object.assign(new Error(`path escapes the workspace: ${p}`), { code: "EACCES" });
  }
  return real;
}

/**
 * The part of E2B's `files` API the Resources docs use, on a local
 * directory. Paths resolve inside the workspace (a leading `/` is its
 * root); a `..` or a symlink that escapes it throws. Text is UTF-8; a
 * missing file throws an `ENOENT` error.
 */
export class LocalFiles {
  constructor(private readonly root: string) {}

  private inner(p: string): string {
    const real = resolveInside(this.root, p);
    if (real === fs.realpathSync(this.root)) {
      throw Object.assign(new Error("the workspace root itself cannot be written or removed"), { code: "EACCES" });
    }
    return real;
  }

  /** The file's contents: a string, or bytes with `{ format: "bytes" }`. */
  read(p: string): Promise<string>;
  read(p: string, options: { format: "text" }): Promise<string>;
  read(p: string, options: { format: "bytes" }): Promise<Uint8Array>;
  async read(p: string, options: { format?: "text" | "bytes" } = {}): Promise<string | Uint8Array> {
    const format = options.format ?? "text";
    if (format !== "text" && format !== "bytes") throw new TypeError(`format must be "text" or "bytes", not ${String(format)}`);
    const data = await fs.promises.readFile(resolveInside(this.root, p));
    return format === "text" ? data.toString("utf8") : new Uint8Array(data);
  }

  /** Write a file atomically (temp file + rename), creating parents. */
  async write(p: string, data: string | Uint8Array): Promise<void> {
    if (typeof data !== "string" && !(data instanceof Uint8Array)) throw new TypeError("data must be a string or a Uint8Array");
    const real = this.inner(p);
    const parent = path.dirname(real);
    await fs.promises.mkdir(parent, { recursive: true });
    let mode = 0o644;
    try {
      mode = (await fs.promises.stat(real)).mode & 0o777;
    } catch {
      // a new file
    }
    const tmp = tempPath(parent, path.basename(real));
    try {
      await fs.promises.writeFile(tmp, data, { flag: "wx", mode: 0o600 });
      await fs.promises.chmod(tmp, mode);
      await fs.promises.rename(tmp, real);
    } catch (e) {
      await fs.promises.rm(tmp, { force: true });
      throw e;
    }
  }

  /** The names in a directory, sorted. */
  async list(p = "/"): Promise<string[]> {
    return (await fs.promises.readdir(resolveInside(this.root, p))).sort(compareUtf8);
  }

  async exists(p: string): Promise<boolean> {
    try {
      await fs.promises.lstat(resolveInside(this.root, p));
      return true;
    } catch {
      return false;
    }
  }

  /** Remove a file, a symlink or a directory tree. */
  async remove(p: string): Promise<void> {
    const real = this.inner(p);
    const st = await fs.promises.lstat(real);
    await fs.promises.rm(real, { recursive: st.isDirectory() });
  }

  /** Create a directory and its parents; false when it already existed. */
  async makeDir(p: string): Promise<boolean> {
    const real = this.inner(p);
    if (isDir(real)) return false;
    await fs.promises.mkdir(real, { recursive: true });
    return true;
  }
}

/** What an earlier capture of a handle learnt of a file. */
interface Known {
  key: string; // mode, size, mtime, ctime, inode and device then
  entry: string; // its manifest entry, serialised
  object: string; // its object's path
}

/** A live workspace: `path` is the directory, `files` the file API. */
export class LocalDirectoryHandle {
  readonly files: LocalFiles;
  /** @internal path → the file as an earlier capture saw it (outside the racy window). */
  known = new Map<string, Known>();
  constructor(readonly path: string) {
    this.files = new LocalFiles(path);
  }
}

const statKey = (st: fs.BigIntStats): string => `${st.mode}:${st.size}:${st.mtimeNs}:${st.ctimeNs}:${st.ino}:${st.dev}`;

/**
 * New store files, published together: each is written to `tmp/`, then all
 * are fsynced, renamed into place, and the renamed-into directories
 * fsynced. Until then nothing in the store refers to a file a crash could
 * lose; `discard` removes what was not published.
 */
class Batch {
  private staged: [string, string][] = []; // (temp file, final path)
  private readonly finals = new Set<string>();
  constructor(private readonly tmp: string) {}

  has(final: string): boolean {
    return this.finals.has(final);
  }

  add(data: Uint8Array, final: string): void {
    const tmp = path.join(this.tmp, randomUUID().replaceAll("-", ""));
    const fd = fs.openSync(tmp, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL, 0o600);
    this.staged.push([tmp, final]);
    this.finals.add(final);
    try {
      fs.writeSync(fd, data);
      fs.fchmodSync(fd, 0o444);
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
  }

  commit(): void {
    const dirs = new Set<string>();
    for (const [tmp, final] of this.staged) {
      const parent = path.dirname(final);
      if (!isDir(parent)) {
        fs.mkdirSync(parent, { recursive: true }); // an object's first fan-out directory
        dirs.add(path.dirname(parent)); // whose entry must last too
      }
      fs.renameSync(tmp, final);
      dirs.add(parent);
    }
    this.staged = [];
    for (const d of [...dirs].sort()) fsyncPath(d);
  }

  discard(): void {
    for (const [tmp] of this.staged) fs.rmSync(tmp, { force: true });
    this.staged = [];
  }
}

export interface LocalDirectoryOptions {
  /** Default `REBUNO_LOCAL_RESOURCES`, else `./.rebuno/resources`. */
  root?: string | undefined;
  /** A directory copied as the initial environment (otherwise empty). */
  template?: string | undefined;
  /** Keep coverage across steps that do not declare the resource. */
  coverageReuse?: boolean | undefined;
}

/**
 * A resource driver for a local directory (`driverId`
 * `"rebuno.local_directory.v1"`). `coverageReuse: true` keeps coverage
 * across steps that do not declare the resource; use it when every change
 * goes through declared tools and steps. The store is never garbage-collected.
 */
export class LocalDirectory implements ResourceDriver<LocalDirectoryHandle, { path: string }> {
  readonly driverId = DRIVER_ID;
  readonly root: string;
  readonly template: string | null;
  readonly coverageReuse: boolean;

  constructor(options: LocalDirectoryOptions = {}) {
    if (options.coverageReuse !== undefined && typeof options.coverageReuse !== "boolean") throw new TypeError("coverageReuse must be a boolean");
    this.root = path.resolve(options.root ?? (process.env[ENV_ROOT] || DEFAULT_ROOT));
    this.template = options.template === undefined ? null : path.resolve(options.template);
    this.coverageReuse = options.coverageReuse ?? false;
  }

  /** `{"template": <absolute path or null>}`: the root is placement, not behaviour. */
  get configuration(): { template: string | null } {
    return { template: this.template };
  }

  get workspaces(): string { return path.join(this.root, "workspaces"); }
  get objects(): string { return path.join(this.root, "store", "objects"); }
  get snapshots(): string { return path.join(this.root, "store", "snapshots"); }
  get tmp(): string { return path.join(this.root, "tmp"); }

  objectPath(digest: string): string {
    return path.join(this.objects, digest.slice(0, 2), digest.slice(2));
  }

  /** The manifest file of a ref (`sha256:<hex>`). */
  snapshotPath(ref: string): string {
    const m = REF.exec(ref);
    if (!m) throw new TypeError(`not a local snapshot ref: ${JSON.stringify(ref)}`);
    return path.join(this.snapshots, `${m[1]}.json`);
  }

  private layout(): void {
    if (!isDir(this.root)) {
      makeDirs(this.root, 0o700);
      fs.chmodSync(this.root, 0o700);
    }
    for (const d of [this.workspaces, this.objects, this.snapshots, this.tmp]) if (!isDir(d)) makeDirs(d, 0o777);
  }

  // ------------------------------------------------------------ driver

  /**
   * A new directory under `workspaces/`: from the checkpoint, else the
   * template, else empty. The binding is `{ path: <directory> }`.
   */
  async create(checkpointRef?: string): Promise<Created<LocalDirectoryHandle, { path: string }>> {
    this.layout();
    const dir = checkpointRef === undefined ? this.fresh() : this.restore(checkpointRef);
    return { handle: new LocalDirectoryHandle(dir), binding: { path: dir } };
  }

  /**
   * The handle of a recorded workspace; an `ENOENT` error when its directory
   * is gone. A workspace is reopened after its agent stopped, perhaps
   * mid-write: the temporary files of such writes are removed.
   */
  async open(binding: { path: string }): Promise<LocalDirectoryHandle> {
    if (typeof binding !== "object" || binding === null || typeof binding.path !== "string") {
      throw new TypeError(`a LocalDirectory binding is {"path": "<directory>"}, not ${JSON.stringify(binding)}`);
    }
    if (!isDir(binding.path)) {
      throw Object.assign(new Error(`the workspace directory is gone: ${binding.path}`), { code: "ENOENT", path: binding.path });
    }
    removeInterruptedWrites(binding.path);
    return new LocalDirectoryHandle(binding.path);
  }

  /** Snapshot the workspace; returns `sha256:<hex of the manifest>`. */
  async checkpoint(handle: LocalDirectoryHandle): Promise<string> {
    if (!(handle instanceof LocalDirectoryHandle)) throw new TypeError("not a LocalDirectory handle");
    this.layout();
    if (!isDir(handle.path)) throw Object.assign(new Error(`the workspace directory is gone: ${handle.path}`), { code: "ENOENT" });
    const settled = BigInt(Date.now()) * 1_000_000n - RACY_NS;
    const batch = new Batch(this.tmp);
    const known = new Map<string, Known>();
    try {
      const parts: [string, string][] = [];
      this.walk(handle, handle.path, "", parts, known, settled, batch);
      const data = assemble(parts);
      const digest = sha256(data);
      const final = path.join(this.snapshots, `${digest}.json`);
      if (!isFile(final)) batch.add(data, final);
      batch.commit();
      // Only now are the objects the new entries name durable.
      handle.known = known;
      return `sha256:${digest}`;
    } finally {
      batch.discard();
    }
  }

  // ------------------------------------------------------------ create

  private fresh(): string {
    const staging = path.join(this.tmp, randomUUID().replaceAll("-", ""));
    try {
      const [files, dirs] = this.template === null ? (fs.mkdirSync(staging), [[], [staging]]) : copyTree(this.template, staging);
      return this.publishWorkspace(staging, files, dirs);
    } catch (e) {
      removeTree(staging);
      throw e;
    }
  }

  /** Make a staged tree durable, then rename it into `workspaces/`: a directory there is always complete. */
  private publishWorkspace(staging: string, files: string[], dirs: string[]): string {
    for (const f of files) fsyncPath(f);
    for (const d of dirs) fsyncPath(d);
    const final = path.join(this.workspaces, randomUUID());
    fs.renameSync(staging, final);
    fsyncPath(this.workspaces);
    return final;
  }

  private restore(ref: string): string {
    const unavailable = (e: Damaged): CheckpointUnavailable => new CheckpointUnavailable(`local snapshot ${ref} is missing or damaged: ${e.message}`);
    let entries: ManifestEntry[];
    try {
      entries = this.readManifest(ref);
    } catch (e) {
      if (e instanceof Damaged) throw unavailable(e);
      throw e;
    }
    const staging = path.join(this.tmp, randomUUID().replaceAll("-", ""));
    fs.mkdirSync(staging);
    try {
      const [files, dirs] = this.materialise(entries, staging);
      return this.publishWorkspace(staging, files, dirs);
    } catch (e) {
      removeTree(staging);
      if (e instanceof Damaged) throw unavailable(e);
      throw e;
    }
  }

  private readManifest(ref: unknown): ManifestEntry[] {
    const m = typeof ref === "string" ? REF.exec(ref) : null;
    if (!m) throw new Damaged("the ref is not sha256:<64 lowercase hex digits>");
    let data: Buffer;
    try {
      data = fs.readFileSync(path.join(this.snapshots, `${m[1]}.json`));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") throw new Damaged("the manifest does not exist");
      throw new Damaged(`the manifest cannot be read: ${(e as Error).message}`);
    }
    if (sha256(data) !== m[1]) throw new Damaged("the manifest does not match its hash");
    return parseManifest(data);
  }

  /** Build the tree in `staging`; return its files and directories. */
  private materialise(entries: ManifestEntry[], staging: string): [string[], string[]] {
    const made = new Set<string>([staging]);
    const files: string[] = [];
    const dirs: [string, number][] = [];
    for (const e of [...entries].sort((a, b) => compareUtf8(a.path, b.path))) {
      const dest = `${staging}/${e.path}`;
      const parent = path.dirname(dest);
      if (!made.has(parent)) {
        // A parent the manifest does not list.
        fs.mkdirSync(parent, { recursive: true });
        for (let p = parent; !made.has(p); p = path.dirname(p)) made.add(p);
      }
      if (e.type === "file") {
        this.copyObject(e.sha256, e.size, dest, e.mode);
        files.push(dest);
      } else if (e.type === "dir") {
        fs.mkdirSync(dest, 0o700);
        made.add(dest);
        dirs.push([dest, e.mode]);
      } else {
        fs.symlinkSync(e.target, dest);
      }
    }
    // Deepest first, so that no parent turns read-only too early.
    for (const [dest, mode] of dirs.reverse()) fs.chmodSync(dest, mode);
    return [files, [...made]];
  }

  /** Copy an object to a new file, checking it against its hash. */
  private copyObject(digest: string, size: number, dest: string, mode: number): void {
    let src: number;
    try {
      src = fs.openSync(this.objectPath(digest), fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
    } catch {
      throw new Damaged(`object ${digest} does not exist`);
    }
    try {
      if (!fs.fstatSync(src).isFile()) throw new Damaged(`object ${digest} does not exist`);
      const out = fs.openSync(dest, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL, 0o600);
      try {
        const h = createHash("sha256");
        const buf = Buffer.allocUnsafe(Math.min(CHUNK, Math.max(1, size)));
        let total = 0;
        // Bytes past the recorded size are not read: what is restored is what the hash names.
        while (total < size) {
          const n = fs.readSync(src, buf, 0, Math.min(buf.length, size - total), null);
          if (n === 0) break;
          h.update(buf.subarray(0, n));
          fs.writeSync(out, buf, 0, n);
          total += n;
        }
        if (total !== size || h.digest("hex") !== digest) throw new Damaged(`object ${digest} is damaged`);
        fs.fchmodSync(out, mode);
      } finally {
        fs.closeSync(out);
      }
    } finally {
      fs.closeSync(src);
    }
  }

  // -------------------------------------------------------- checkpoint

  /** Add the entries below a directory to `parts`, and files hashed before `settled` to `known`. */
  private walk(handle: LocalDirectoryHandle, dir: string, prefix: string, parts: [string, string][], known: Map<string, Known>,
    settled: bigint, batch: Batch): void {
    const names = fs.readdirSync(dir, { encoding: "buffer" }).map((n) => decodeName(n, prefix + n.toString("utf8")));
    names.sort(compareUtf8);
    for (const name of names) {
      const rel = prefix + name;
      const full = path.join(dir, name);
      const st = fs.lstatSync(full, { bigint: true });
      if (st.isFile()) {
        const hit = handle.known.get(rel);
        if (hit && hit.key === statKey(st) && isFile(hit.object)) {
          known.set(rel, hit);
          parts.push([rel, hit.entry]);
          continue;
        }
        const stored = this.storeObject(full, rel, st, batch);
        parts.push([rel, stored.entry]);
        if ((st.mtimeNs > st.ctimeNs ? st.mtimeNs : st.ctimeNs) < settled) known.set(rel, stored);
      } else if (st.isSymbolicLink()) {
        const target = decodeName(fs.readlinkSync(full, { encoding: "buffer" }), rel);
        parts.push([rel, entryText({ path: rel, target, type: "symlink" })]);
      } else if (st.isDirectory()) {
        parts.push([rel, entryText({ mode: Number(st.mode) & 0o777, path: rel, type: "dir" })]);
        this.walk(handle, full, rel + "/", parts, known, settled, batch);
      } else {
        throw new Error(`${rel}: cannot capture a FIFO, socket or device file`);
      }
    }
  }

  /** Hash a file and stage its object unless the store has it; what is staged is what was hashed. */
  private storeObject(full: string, rel: string, st: fs.BigIntStats, batch: Batch): Known {
    const size = Number(st.size);
    const fd = fs.openSync(full, "r");
    let digest: string;
    let data: Buffer | undefined;
    try {
      if (size <= CHUNK) {
        data = Buffer.allocUnsafe(size);
        let got = 0;
        while (got < size) {
          const n = fs.readSync(fd, data, got, size - got, null);
          if (n === 0) break;
          got += n;
        }
        if (got !== size) throw new Error(`${rel}: the file changed while it was captured`);
        digest = sha256(data);
      } else {
        const h = createHash("sha256");
        const buf = Buffer.allocUnsafe(CHUNK);
        for (let n = fs.readSync(fd, buf); n > 0; n = fs.readSync(fd, buf)) h.update(buf.subarray(0, n));
        digest = h.digest("hex");
      }
    } finally {
      fs.closeSync(fd);
    }
    const object = this.objectPath(digest);
    if (!batch.has(object) && !isFile(object)) {
      const content = data ?? fs.readFileSync(full);
      if (data === undefined && sha256(content) !== digest) throw new Error(`${rel}: the file changed while it was captured`);
      batch.add(content, object);
    }
    if (statKey(fs.lstatSync(full, { bigint: true })) !== statKey(st)) throw new Error(`${rel}: the file changed while it was captured`);
    const entry = entryText({ mode: Number(st.mode) & 0o777, path: rel, sha256: digest, size, type: "file" });
    return { key: statKey(st), entry, object };
  }
}

function validPath(p: string): boolean {
  if (!p || p.startsWith("/") || p.includes("\0")) return false;
  return p.split("/").every((s) => s !== "" && s !== "." && s !== "..");
}

const isInt = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v);

/** Validate a manifest: its format, and every entry's shape, path, hash and mode; no entry lies below a symlink or a file. */
export function parseManifest(data: Buffer): ManifestEntry[] {
  let doc: unknown;
  try {
    doc = JSON.parse(utf8.decode(data));
  } catch {
    throw new Damaged("the manifest is not valid JSON");
  }
  if (typeof doc !== "object" || doc === null || Array.isArray(doc) || Object.keys(doc).sort().join() !== "entries,format" ||
    (doc as { format?: unknown }).format !== FORMAT) {
    throw new Damaged(`the manifest is not in the ${FORMAT} format`);
  }
  const entries = (doc as { entries: unknown }).entries;
  if (!Array.isArray(entries)) throw new Damaged("the manifest's entries are not a list");
  const types = new Map<string, string>();
  for (const e of entries as unknown[]) {
    const rec = typeof e === "object" && e !== null && !Array.isArray(e) ? (e as Record<string, unknown>) : undefined;
    const keys = rec && typeof rec.type === "string" ? ENTRY_KEYS[rec.type] : undefined;
    if (!rec || !keys || Object.keys(rec).sort().join() !== keys.join()) throw new Damaged(`invalid entry ${JSON.stringify(e)}`);
    const p = rec.path;
    if (typeof p !== "string" || !validPath(p)) throw new Damaged(`invalid path ${JSON.stringify(p)}`);
    if (types.has(p)) throw new Damaged(`duplicate path ${JSON.stringify(p)}`);
    types.set(p, rec.type as string);
    if (rec.type !== "symlink" && (!isInt(rec.mode) || rec.mode < 0 || rec.mode > 0o777)) {
      throw new Damaged(`invalid mode ${JSON.stringify(rec.mode)} of ${JSON.stringify(p)}`);
    }
    if (rec.type === "file") {
      if (typeof rec.sha256 !== "string" || !HEX.test(rec.sha256)) throw new Damaged(`invalid object hash of ${JSON.stringify(p)}`);
      if (!isInt(rec.size) || rec.size < 0) throw new Damaged(`invalid size of ${JSON.stringify(p)}`);
    } else if (rec.type === "symlink") {
      if (typeof rec.target !== "string" || !rec.target || rec.target.includes("\0")) throw new Damaged(`invalid symlink target of ${JSON.stringify(p)}`);
    }
  }
  for (const p of types.keys()) {
    // Up to the nearest listed ancestor: its own ancestors are checked in its turn.
    for (let i = p.lastIndexOf("/"); i > 0; i = p.lastIndexOf("/", i - 1)) {
      const above = types.get(p.slice(0, i));
      if (above !== undefined) {
        if (above !== "dir") throw new Damaged(`${JSON.stringify(p)} lies below a ${above}`);
        break;
      }
    }
  }
  return entries as ManifestEntry[];
}

/**
 * Copy a template: directories, regular files and symlinks, with their
 * modes; anything else is refused. Returns the files and directories made.
 */
function copyTree(src: string, dst: string): [string[], string[]] {
  const st = fs.statSync(src);
  if (!st.isDirectory()) throw Object.assign(new Error(`the template is not a directory: ${src}`), { code: "ENOTDIR" });
  fs.mkdirSync(dst, 0o700);
  const dirs: [string, number][] = [[dst, st.mode & 0o777]];
  const files: string[] = [];
  const copy = (from: string, to: string): void => {
    for (const name of fs.readdirSync(from).sort(compareUtf8)) {
      const s = path.join(from, name);
      const d = path.join(to, name);
      const l = fs.lstatSync(s);
      if (l.isSymbolicLink()) fs.symlinkSync(fs.readlinkSync(s), d);
      else if (l.isDirectory()) {
        fs.mkdirSync(d, 0o700);
        dirs.push([d, l.mode & 0o777]);
        copy(s, d);
      } else if (l.isFile()) {
        fs.copyFileSync(s, d);
        fs.chmodSync(d, l.mode & 0o777);
        files.push(d);
      } else throw new Error(`${s}: cannot copy a FIFO, socket or device file`);
    }
  };
  copy(src, dst);
  for (const [d, mode] of [...dirs].reverse()) fs.chmodSync(d, mode);
  return [files, dirs.map(([d]) => d)];
}
