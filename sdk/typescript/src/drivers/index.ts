/** Built-in resource drivers: `import { LocalDirectory } from "rebuno/drivers"`. */
export { LocalDirectory, LocalDirectoryHandle, LocalFiles, manifestBytes, FORMAT, type LocalDirectoryOptions, type ManifestEntry } from "./local-directory.js";
