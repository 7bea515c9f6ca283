import { Sandbox, SandboxError } from "e2b";
import { CheckpointUnavailable, type ResourceDriver } from "rebuno";

class E2BHandle {
  constructor(public sandbox: Sandbox) {}

  get files() { return this.sandbox.files; }
}

export class E2BResource implements ResourceDriver<E2BHandle, { sandboxId: string }> {
  driverId = "example.e2b.v1";

  constructor(private timeoutMs = 600_000) {}

  get configuration() { return { timeoutMs: this.timeoutMs }; }

  async create(checkpointRef?: string) {
    try {
      const sandbox = await Sandbox.create(checkpointRef ?? "base", {
        timeoutMs: this.timeoutMs,
      });
      return { handle: new E2BHandle(sandbox), binding: { sandboxId: sandbox.sandboxId } };
    } catch (error) {
      if (checkpointRef && error instanceof SandboxError && error.statusCode === 404)
        throw new CheckpointUnavailable(`checkpoint missing: ${checkpointRef}`);
      throw error;
    }
  }

  async open(binding: { sandboxId: string }) {
    const sandbox = await Sandbox.connect(binding.sandboxId, { timeoutMs: this.timeoutMs });
    return new E2BHandle(sandbox);
  }

  async checkpoint(handle: E2BHandle) {
    const snapshot = await handle.sandbox.createSnapshot();
    handle.sandbox = await Sandbox.connect(handle.sandbox.sandboxId, { timeoutMs: this.timeoutMs });
    return snapshot.snapshotId;
  }
}
