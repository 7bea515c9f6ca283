/** The published tarball: built code, types, README and LICENSE, nothing else. */

import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const PACKAGE = fileURLToPath(new URL("..", import.meta.url));

describe("npm pack", () => {
  it("ships dist (code and .d.ts), README and LICENSE only", () => {
    const [info] = JSON.parse(execFileSync("npm", ["pack", "--dry-run", "--json"], { cwd: PACKAGE, encoding: "utf8" })) as { files: { path: string }[] }[];
    const files = info!.files.map((f) => f.path).sort();
    expect(files).toContain("dist/index.js");
    expect(files).toContain("dist/index.d.ts");
    expect(files).toContain("dist/drivers/index.js");
    expect(files).toContain("dist/drivers/index.d.ts");
    const others = files.filter((f) => !/^dist\/.+\.(js|d\.ts)$/.test(f));
    expect(others).toEqual(["LICENSE", "README.md", "package.json"]);
  });

  it("has no runtime dependencies", async () => {
    const pkg = (await import("../package.json", { with: { type: "json" } })).default as { dependencies?: object };
    expect(pkg.dependencies ?? {}).toEqual({});
  });
});
