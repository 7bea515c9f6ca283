"""The Python twin of the TypeScript `writer` agent of cross-sdk.test.ts:
the same steps with the same identities, on the Python SDK, so that an
execution begun by one SDK can be forked and finished by the other."""

import json
import os
from typing import Any

from rebuno import Agent, CheckpointPolicy, execution, resource, step, tool
from rebuno.drivers import LocalDirectory

DRIVER = LocalDirectory()


async def process(writes: int, every: int, who: str) -> dict[str, Any]:
    ws = await resource("workspace", driver=DRIVER, checkpoints=CheckpointPolicy(every_steps=every))
    opened = {name: await ws.files.read(name) for name in await ws.files.list()}
    with open(os.environ["OPENED"], "a") as f:  # what this dispatch found: the restored state
        f.write(json.dumps({"execution": execution().execution_id, "sdk": "python", "files": opened}) + "\n")

    @tool("write_file", resources=["workspace"])
    async def write_file(path: str, content: str) -> str:
        await ws.files.write(path, content)
        return f"wrote {path}"

    for k in range(1, writes + 1):
        await write_file(f"f{k}", f"{k} by {who}")
    listed = await step("list", ws.files.list)
    return {"files": listed}


if __name__ == "__main__":
    print(f"PORT {os.environ['PORT']}", flush=True)
    Agent(os.environ["AGENT_ID"]).run(process, host="127.0.0.1", port=int(os.environ["PORT"]), log_level="warning")
