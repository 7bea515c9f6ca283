import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CheckpointUnavailable } from "../src/errors.js";
import { LocalDirectory, LocalDirectoryHandle, manifestBytes, type ManifestEntry } from "../src/drivers/index.js";
import { tempPath } from "../src/drivers/local-directory.js";
import { loadVectors, type ManifestCase, type TreeFile } from "./vectors.js";

const vectors = loadVectors<{ cases: ManifestCase[] }>("local-directory").cases;

/** Make the tree a vector describes (modes of directories last). */
function build(root: string, files: TreeFile[]): void {
  for (const f of files) {
    const p = path.join(root, f.path);
    if (f.type === "dir") fs.mkdirSync(p, { recursive: true });
    else if (f.type === "file") {
      fs.mkdirSync(path.dirname(p), { recursive: true });
      fs.writeFileSync(p, f.content!);
      fs.chmodSync(p, f.mode!);
    } else fs.symlinkSync(f.target!, p);
  }
  for (const f of files) if (f.type === "dir") fs.chmodSync(path.join(root, f.path), f.mode!);
}

/** Everything below a directory: path → [type, mode, content] / [symlink, target]. */
function tree(root: string): Record<string, unknown[]> {
  const out: Record<string, unknown[]> = {};
  const walk = (dir: string): void => {
    for (const name of fs.readdirSync(dir)) {
      const p = path.join(dir, name);
      const rel = path.relative(root, p);
      const st = fs.lstatSync(p);
      if (st.isSymbolicLink()) out[rel] = ["symlink", fs.readlinkSync(p)];
      else if (st.isDirectory()) {
        out[rel] = ["dir", st.mode & 0o777];
        walk(p);
      } else out[rel] = ["file", st.mode & 0o777, fs.readFileSync(p, "utf8")];
    }
  };
  walk(root);
  return out;
}

let tmp: string;
let driver: LocalDirectory;
beforeEach(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), "rebuno-ld-"));
  driver = new LocalDirectory({ root: path.join(tmp, "res") });
});
afterEach(() => {
  execFileSync("chmod", ["-R", "u+rwX", tmp]);
  fs.rmSync(tmp, { recursive: true, force: true });
});

async function golden(): Promise<[LocalDirectoryHandle, string]> {
  const { handle } = await driver.create();
  build(handle.path, vectors[0]!.files);
  return [handle, await driver.checkpoint(handle)];
}

describe("manifests (shared vectors)", () => {
  it.each(vectors.map((c) => [c.name, c] as const))("%s", async (_name, c) => {
    const { handle } = await driver.create();
    build(handle.path, c.files);
    const ref = await driver.checkpoint(handle);
    expect(ref).toBe(c.ref);
    const data = fs.readFileSync(driver.snapshotPath(ref));
    expect(data.toString("utf8")).toBe(c.manifest);
    expect(data.length).toBe(c.manifest_length);
    // The pure serialisation gives the same bytes whatever the input order.
    const entries = (JSON.parse(c.manifest) as { entries: ManifestEntry[] }).entries;
    expect(manifestBytes([...entries].reverse()).equals(data)).toBe(true);
  });
});

describe("LocalDirectory", () => {
  it("has the driver's identity and configuration", () => {
    const d = new LocalDirectory({ root: path.join(tmp, "r"), template: path.join(tmp, "tpl"), coverageReuse: true });
    expect(d.driverId).toBe("rebuno.local_directory.v1");
    expect(d.configuration).toEqual({ template: path.join(tmp, "tpl") });
    expect(d.coverageReuse).toBe(true);
    expect(new LocalDirectory({ root: "x" }).configuration).toEqual({ template: null });
  });

  it("creates a private root with its layout", async () => {
    await driver.create();
    expect(fs.statSync(driver.root).mode & 0o777).toBe(0o700);
    expect(fs.readdirSync(driver.root).sort()).toEqual(["store", "tmp", "workspaces"]);
  });

  it("shares a ref for an unchanged tree and stores identical files once", async () => {
    const [handle, ref] = await golden();
    expect(await driver.checkpoint(handle)).toBe(ref);
    fs.writeFileSync(path.join(handle.path, "copy.txt"), "hi\n");
    const ref2 = await driver.checkpoint(handle);
    expect(ref2).not.toBe(ref);
    const objects = fs.readdirSync(driver.objects).flatMap((fan) => fs.readdirSync(path.join(driver.objects, fan)));
    expect(objects).toHaveLength(2);
  });

  it("sees a change that keeps the size (times and inode change)", async () => {
    const [handle, ref] = await golden();
    fs.writeFileSync(path.join(handle.path, "hello.txt"), "ho\n");
    const ref2 = await driver.checkpoint(handle);
    expect(ref2).not.toBe(ref);
    const { handle: back } = await driver.create(ref2);
    expect(fs.readFileSync(path.join(back.path, "hello.txt"), "utf8")).toBe("ho\n");
  });

  it("restores a checkpoint exactly, into a new directory, by copying", async () => {
    const [handle, ref] = await golden();
    fs.symlinkSync("hello.txt", path.join(handle.path, "link"));
    const ref2 = await driver.checkpoint(handle);
    const { handle: restored, binding } = await driver.create(ref2);
    expect(binding).toEqual({ path: restored.path });
    expect(restored.path).not.toBe(handle.path);
    expect(tree(restored.path)).toEqual(tree(handle.path));
    await restored.files.write("hello.txt", "changed");
    const { handle: again } = await driver.create(ref);
    expect(await again.files.read("hello.txt")).toBe("hi\n");
  });

  it.each([
    ["a malformed ref", () => "sha256:xyz"],
    ["a missing manifest", () => `sha256:${"0".repeat(64)}`],
  ])("throws CheckpointUnavailable for %s", async (_what, ref) => {
    await expect(driver.create(ref())).rejects.toThrow(CheckpointUnavailable);
  });

  it("throws CheckpointUnavailable for a damaged object or manifest, leaving nothing behind", async () => {
    const [, ref] = await golden();
    const manifest = JSON.parse(fs.readFileSync(driver.snapshotPath(ref), "utf8")) as { entries: { sha256?: string }[] };
    const obj = driver.objectPath(manifest.entries[0]!.sha256!);
    fs.chmodSync(obj, 0o644);
    fs.writeFileSync(obj, "xx\n");
    await expect(driver.create(ref)).rejects.toThrow(/local snapshot sha256:\w+ is missing or damaged: object \w+ is damaged/);
    fs.rmSync(obj);
    await expect(driver.create(ref)).rejects.toThrow(/does not exist/);
    expect(fs.readdirSync(driver.tmp)).toEqual([]);
    fs.chmodSync(driver.snapshotPath(ref), 0o644);
    fs.appendFileSync(driver.snapshotPath(ref), " ");
    await expect(driver.create(ref)).rejects.toThrow(/does not match its hash/);
  });

  it("refuses a manifest whose paths escape the workspace", async () => {
    const evil = manifestBytes([
      { path: "l", target: "/etc", type: "symlink" },
      { mode: 0o644, path: "l/passwd", sha256: "0".repeat(64), size: 0, type: "file" },
    ]);
    const digest = (await import("node:crypto")).createHash("sha256").update(evil).digest("hex");
    await driver.create();
    fs.writeFileSync(path.join(driver.snapshots, `${digest}.json`), evil);
    await expect(driver.create(`sha256:${digest}`)).rejects.toThrow(/lies below a symlink/);
    const dotdot = manifestBytes([{ mode: 0o644, path: "../x", sha256: "0".repeat(64), size: 0, type: "file" }]);
    const d2 = (await import("node:crypto")).createHash("sha256").update(dotdot).digest("hex");
    fs.writeFileSync(path.join(driver.snapshots, `${d2}.json`), dotdot);
    await expect(driver.create(`sha256:${d2}`)).rejects.toThrow(/invalid path/);
  });

  it("copies a template as the initial environment", async () => {
    const tpl = path.join(tmp, "tpl");
    build(tpl, vectors[0]!.files);
    const d = new LocalDirectory({ root: path.join(tmp, "r2"), template: tpl });
    const { handle } = await d.create();
    expect(tree(handle.path)).toEqual(tree(tpl));
  });

  it("opens a recorded workspace, and fails with ENOENT when it is gone", async () => {
    const { handle, binding } = await driver.create();
    expect((await driver.open(binding)).path).toBe(handle.path);
    fs.rmSync(handle.path, { recursive: true });
    await expect(driver.open(binding)).rejects.toMatchObject({ code: "ENOENT" });
  });

  it("removes, on reopening, the temporary files of writes a crash cut short", async () => {
    // A kill -9 between a write's temporary file and its rename leaves the
    // temporary file; the reopened workspace must not keep it (nor capture it).
    const { handle, binding } = await driver.create();
    await handle.files.write("deep/notes.txt", "kept");
    const left = [tempPath(handle.path, "a.txt"), tempPath(path.join(handle.path, "deep"), "notes.txt")];
    const users = [".a.txt.rebuno-tmp", "b.rebuno-tmp", ".a.txt.1234.rebuno-tmp"].map((n) => path.join(handle.path, n));
    for (const p of [...left, ...users]) fs.writeFileSync(p, "x");
    await driver.open(binding);
    expect(left.filter((p) => fs.existsSync(p))).toEqual([]);
    expect(users.filter((p) => fs.existsSync(p))).toEqual(users);
    expect(await handle.files.read("deep/notes.txt")).toBe("kept");
  });

  it("refuses a FIFO", async () => {
    const { handle } = await driver.create();
    execFileSync("mkfifo", [path.join(handle.path, "pipe")]);
    await expect(driver.checkpoint(handle)).rejects.toThrow(/FIFO/);
  });
});

describe("files", () => {
  it("reads, writes, lists, removes inside the workspace only", async () => {
    const { handle } = await driver.create();
    const files = handle.files;
    await files.write("/a/b.txt", "x");
    expect(await files.read("a/b.txt")).toBe("x");
    expect(await files.read("a/b.txt", { format: "bytes" })).toEqual(new Uint8Array([120]));
    expect(await files.list()).toEqual(["a"]);
    expect(await files.exists("a/b.txt")).toBe(true);
    expect(await files.makeDir("a")).toBe(false);
    expect(await files.makeDir("c/d")).toBe(true);
    await files.remove("a");
    expect(await files.exists("a/b.txt")).toBe(false);
    await expect(files.read("missing")).rejects.toMatchObject({ code: "ENOENT" });
    await expect(files.write("../escape", "x")).rejects.toThrow(/escapes/);
    fs.symlinkSync(tmp, path.join(handle.path, "out"));
    await expect(files.write("out/x", "x")).rejects.toThrow(/escapes/);
    await expect(files.remove("/")).rejects.toThrow(/root/);
  });
});

// The Python SDK's driver, from its own virtualenv: the same store, read by both.
const REPO = fileURLToPath(new URL("../../../", import.meta.url));
const PYTHON = process.env.REBUNO_PYTHON ?? path.join(REPO, "sdk/python/.venv/bin/python");

function python(script: string, ...args: string[]): string {
  if (!fs.existsSync(PYTHON)) throw new Error(`no Python SDK at ${PYTHON}: run make sdk/python/.venv/.installed or set REBUNO_PYTHON`);
  return execFileSync(PYTHON, ["-c", script, ...args], { encoding: "utf8" });
}

const PY_CAPTURE = `
import asyncio, json, os, sys
from rebuno.drivers import LocalDirectory
async def main():
    d = LocalDirectory(sys.argv[1])
    h, _ = await d.create()
    for f in json.loads(sys.argv[2]):
        p = os.path.join(h.path, f["path"])
        if f["type"] == "dir":
            os.makedirs(p, exist_ok=True)
        elif f["type"] == "file":
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, "w").write(f["content"]); os.chmod(p, f["mode"])
        else:
            os.symlink(f["target"], p)
    for f in json.loads(sys.argv[2]):
        if f["type"] == "dir":
            os.chmod(os.path.join(h.path, f["path"]), f["mode"])
    print(json.dumps({"ref": await d.checkpoint(h), "path": h.path}))
asyncio.run(main())
`;

const PY_RESTORE = `
import asyncio, json, sys
from rebuno.drivers import LocalDirectory
async def main():
    h, _ = await LocalDirectory(sys.argv[1]).create(sys.argv[2])
    print(h.path)
asyncio.run(main())
`;

describe("with the Python SDK's LocalDirectory", () => {
  it.each(vectors.map((c) => [c.name, c] as const))("restores what Python captured, and Python what TypeScript captured: %s", async (_name, c) => {
    const captured = JSON.parse(python(PY_CAPTURE, driver.root, JSON.stringify(c.files))) as { ref: string; path: string };
    expect(captured.ref).toBe(c.ref);
    const { handle } = await driver.create(captured.ref);
    expect(tree(handle.path)).toEqual(tree(captured.path));

    await handle.files.write("from-ts.txt", "written by TypeScript\n");
    const ref = await driver.checkpoint(handle);
    const restored = python(PY_RESTORE, driver.root, ref).trim();
    expect(restored).not.toBe(handle.path);
    expect(tree(restored)).toEqual(tree(handle.path));
  });
});
