/** The published tarball: built code, types, README and LICENSE, nothing else. */

import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
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
    expect(files).toContain("dist/mcp.js");
    expect(files).toContain("dist/mcp.d.ts");
    const others = files.filter((f) => !/^dist\/.+\.(js|d\.ts)$/.test(f));
    expect(others).toEqual(["LICENSE", "README.md", "package.json"]);
  });

  it("has no runtime dependencies", async () => {
    const pkg = (await import("../package.json", { with: { type: "json" } })).default as { dependencies?: object };
    expect(pkg.dependencies ?? {}).toEqual({});
  });

  it("exports rebuno/mcp, and no built file imports a package (not even a type from the MCP SDK)", async () => {
    const pkg = (await import("../package.json", { with: { type: "json" } })).default as { exports: Record<string, unknown> };
    expect(Object.keys(pkg.exports)).toEqual([".", "./drivers", "./mcp", "./package.json"]);
    expect(pkg.exports["./mcp"]).toEqual({ types: "./dist/mcp.d.ts", import: "./dist/mcp.js" });
    // By the package's own name, as a user imports it: resolved through the
    // export map to the dist the pack above built (a variable, so that
    // type-checking does not need dist to exist).
    const specifier = "rebuno/mcp";
    const mcp = (await import(specifier)) as Record<string, unknown>;
    expect(Object.keys(mcp).sort()).toEqual(["McpToolError", "mcpResultValue", "wrapMcpTool", "wrapMcpTools"]);
    const dist = path.join(PACKAGE, "dist");
    const imported = new Set<string>();
    for (const file of fs.readdirSync(dist, { recursive: true, encoding: "utf8" })) {
      if (!/\.(js|d\.ts)$/.test(file)) continue;
      const code = fs.readFileSync(path.join(dist, file), "utf8");
      for (const m of code.matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s*"([^"]+)"|\bimport\s*\(\s*"([^"]+)"|^\s*import\s*"([^"]+)"/gm)) {
        imported.add((m[1] ?? m[2] ?? m[3])!);
      }
    }
    expect(imported).toContain("./tool.js"); // the scan does see imports
    expect([...imported].filter((s) => !s.startsWith(".") && !s.startsWith("node:"))).toEqual([]);
  });
});
