from e2b import AsyncSandbox


class E2BHandle:
    def __init__(self, sandbox):
        self.sandbox = sandbox

    @property
    def files(self):
        return self.sandbox.files


class E2BResource:
    driver_id = "example.e2b.v1"

    def __init__(self, timeout=600):
        self.timeout = timeout

    @property
    def configuration(self):
        return {"timeout": self.timeout}

    async def create(self, checkpoint_ref=None):
        sandbox = await AsyncSandbox.create(checkpoint_ref, timeout=self.timeout)
        return E2BHandle(sandbox), {"sandbox_id": sandbox.sandbox_id}

    async def open(self, binding):
        sandbox = await AsyncSandbox.connect(binding["sandbox_id"], timeout=self.timeout)
        return E2BHandle(sandbox)

    async def checkpoint(self, handle):
        snapshot = await handle.sandbox.create_snapshot()
        handle.sandbox = await AsyncSandbox.connect(handle.sandbox.sandbox_id, timeout=self.timeout)
        return snapshot.snapshot_id
