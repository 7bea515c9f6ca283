// User JSON shown as the kernel stores it. JSON.parse would reorder keys that
// look like integers and round large numbers; this reader keeps every
// member in order and every number as written, and the printer indents
// what it read.

/**
 * @typedef {{kind: "object", members: Array<[string, JsonNode]>}
 *   | {kind: "array", elems: JsonNode[]}
 *   | {kind: "string", value: string}
 *   | {kind: "scalar", raw: string}} JsonNode
 */

/**
 * Reads one JSON text. It trusts the kernel to send valid JSON and throws on
 * anything else.
 * @param {string} text
 * @returns {JsonNode}
 */
export function parse(text) {
  let i = 0;
  const space = () => {
    while (i < text.length && " \t\r\n".includes(text[i] ?? "")) i++;
  };
  /** @returns {string} */
  const string = () => {
    const start = i++;
    while (text[i] !== '"') {
      if (i >= text.length) throw new SyntaxError("unterminated string");
      i += text[i] === "\\" ? 2 : 1;
    }
    i++;
    return JSON.parse(text.slice(start, i));
  };
  /** @returns {JsonNode} */
  const value = () => {
    space();
    const c = text[i];
    if (c === "{") {
      i++;
      /** @type {Array<[string, JsonNode]>} */
      const members = [];
      space();
      if (text[i] === "}") {
        i++;
        return { kind: "object", members };
      }
      for (;;) {
        space();
        const key = string();
        space();
        if (text[i++] !== ":") throw new SyntaxError("expected :");
        members.push([key, value()]);
        space();
        const sep = text[i++];
        if (sep === "}") return { kind: "object", members };
        if (sep !== ",") throw new SyntaxError("expected , or }");
      }
    }
    if (c === "[") {
      i++;
      /** @type {JsonNode[]} */
      const elems = [];
      space();
      if (text[i] === "]") {
        i++;
        return { kind: "array", elems };
      }
      for (;;) {
        elems.push(value());
        space();
        const sep = text[i++];
        if (sep === "]") return { kind: "array", elems };
        if (sep !== ",") throw new SyntaxError("expected , or ]");
      }
    }
    if (c === '"') return { kind: "string", value: string() };
    const start = i;
    while (i < text.length && !",]} \t\r\n".includes(text[i] ?? "")) i++;
    if (start === i) throw new SyntaxError("expected a value");
    return { kind: "scalar", raw: text.slice(start, i) };
  };
  const v = value();
  space();
  if (i !== text.length) throw new SyntaxError("trailing text");
  return v;
}

/**
 * A member of an object node; undefined when absent (or not an object).
 * @param {JsonNode | undefined} node
 * @param {string} key
 */
export function member(node, key) {
  if (node?.kind !== "object") return undefined;
  return node.members.find(([k]) => k === key)?.[1];
}

/**
 * Whether a node is JSON null (or absent).
 * @param {JsonNode | undefined} node
 */
export function isNull(node) {
  return node === undefined || (node.kind === "scalar" && node.raw === "null");
}

/**
 * Indented JSON text of a node: two spaces, like JSON.stringify(v, null, 2).
 * @param {JsonNode} node
 * @param {string} [indent]
 * @returns {string}
 */
export function pretty(node, indent = "") {
  const inner = indent + "  ";
  switch (node.kind) {
    case "object":
      if (node.members.length === 0) return "{}";
      return `{\n${node.members.map(([k, v]) => `${inner}${JSON.stringify(k)}: ${pretty(v, inner)}`).join(",\n")}\n${indent}}`;
    case "array":
      if (node.elems.length === 0) return "[]";
      return `[\n${node.elems.map((v) => inner + pretty(v, inner)).join(",\n")}\n${indent}]`;
    case "string":
      return JSON.stringify(node.value);
    case "scalar":
      return node.raw;
  }
}

/**
 * What a person reads: a string as its text (a tool that returns text
 * shows that text), anything else as indented JSON.
 * @param {JsonNode} node
 */
export function display(node) {
  return node.kind === "string" ? node.value : pretty(node);
}
