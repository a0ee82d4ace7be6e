// An independent MCP client against synapolis: the TypeScript SDK 1.x, as Gemini CLI and the MCP Inspector
// use it. It lists the tools, calls each (a success and a failure), validates every result against the
// tool's output schema (the SDK's own client also does, and refuses a mismatch even on errors), reads an
// error's text as the model would, subscribes to an inbox and waits for the notification a signal sent
// by the CLI (another process) brings.
//
//   node check.mjs stdio PYTHON STATE_DIR      synapolis mcp, started by the SDK's stdio transport
//   node check.mjs http URL TOKEN PYTHON STATE_DIR   synapolis serve, with a bearer token
//
// Prints one JSON line with what it checked; exits 1 with the reason on the first problem.
import { execFileSync } from "node:child_process";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ResourceUpdatedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";
import Ajv from "ajv";

const [mode, ...rest] = process.argv.slice(2);
let python, stateDir, transport;
if (mode === "stdio") {
  [python, stateDir] = rest;
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("SYNAPOLIS_")));
  transport = new StdioClientTransport({ command: python, args: ["-m", "synapolis", "--state-dir", stateDir, "mcp"], env });
} else if (mode === "http") {
  const [url, token] = rest;
  [python, stateDir] = rest.slice(2);
  transport = new StreamableHTTPClientTransport(new URL(url + "/mcp"),
    { requestInit: { headers: { Authorization: `Bearer ${token}` } } });
} else {
  console.error("usage: node check.mjs stdio PYTHON STATE_DIR | http URL TOKEN PYTHON STATE_DIR");
  process.exit(2);
}

function fail(message) {
  console.error(`check failed: ${message}`);
  process.exit(1);
}

function cli(...args) {  // the synapolis CLI, as another process
  return execFileSync(python, ["-m", "synapolis", "--state-dir", stateDir, ...args], { encoding: "utf8" });
}

const ajv = new Ajv({ strict: false, allErrors: true });
const client = new Client({ name: "synapolis-ts-check", version: "1.0.0" });
const notified = [];
let wake = null;
client.setNotificationHandler(ResourceUpdatedNotificationSchema, (note) => {
  notified.push(note.params.uri);
  if (wake) wake();
});

await client.connect(transport);
const { tools } = await client.listTools();
const schemas = Object.fromEntries(tools.map((t) => [t.name, t.outputSchema]));
const checked = { tools: tools.length, successes: 0, errors: 0, notified: false };

function validate(name, result) {
  const schema = schemas[name];
  if (!schema) return;
  if (result.structuredContent === undefined) {
    if (!result.isError) fail(`${name}: no structured content on a success`);
    return;
  }
  const valid = ajv.validate(schema, result.structuredContent);
  if (!valid) fail(`${name}: structured content breaks the output schema: ${ajv.errorsText()}`);
}

async function ok(name, args = {}) {
  const result = await client.callTool({ name, arguments: args });  // the SDK validates too
  validate(name, result);
  if (result.isError) fail(`${name} failed: ${result.content?.[0]?.text}`);
  checked.successes++;
  return result.structuredContent;
}

async function fails(name, args, typeName) {
  let result;
  try {
    result = await client.callTool({ name, arguments: args });
  } catch (err) {  // what Gemini CLI would have shown the model instead of our line
    fail(`${name}: the client refused the error result: ${err.message}`);
  }
  validate(name, result);
  const text = result.content?.[0]?.text ?? "";
  if (!result.isError || !new RegExp(`^${typeName} \\(exit \\d\\): `).test(text)) {
    fail(`${name}: expected a ${typeName} line, got ${JSON.stringify(result)}`);
  }
  checked.errors++;
}

// every tool, succeeding
const started = await ok("start_session", { agent_id: "ts-bob" });
const session = started.session_id;
const me = { agent_id: "ts-bob", session_id: session, run_token: started.run_token };
cli("start", "--agent-id", "ts-alice", "--session-id", session);
await ok("beat", { ...me, task: "checking" });
await ok("signal", { ...me, to: "ts-alice", content: "hello from TypeScript" });
await ok("read_signals", me);
await ok("signals_pending", me);
await ok("ack_signals", { ...me, all: true });
await ok("note", { ...me, text: "a note from TypeScript" });
await ok("read_notes", { session_id: session });
await ok("list_agents", { session_id: session });
await ok("write_whiteboard", { ...me, key: "ts", value: "yes" });
await ok("read_whiteboard", { session_id: session, key: "ts" });
const held = await ok("claim", { ...me, item: "ticket:ts" });
await ok("claim_check", { item: "ticket:ts", token: held.claim.token });
await ok("release", { ...me, item: "ticket:ts" });
await ok("guard", { ...me, paths: ["src/free.py"] });

// every tool, failing: the model must read our line
await fails("start_session", { agent_id: "a/../b" }, "UsageError");
await fails("beat", { ...me, status: "bogus" }, "UsageError");
await fails("signal", { ...me, to: "nobody", content: "x" }, "NotFoundError");
await fails("read_signals", { ...me, limit: 0 }, "UsageError");
await fails("ack_signals", { ...me, signal_ids: ["deadbeefdeadbeef"] }, "NotFoundError");
await fails("signals_pending", { ...me, run_token: "wrong" }, "ForbiddenError");
await fails("read_notes", { session_id: "no-such-session" }, "NotFoundError");
await fails("note", { ...me, text: "x".repeat(70000) }, "UsageError");
await fails("list_agents", { session_id: "no-such-session" }, "NotFoundError");
await fails("write_whiteboard", { ...me, key: "", value: "v" }, "UsageError");
await fails("read_whiteboard", { session_id: session, key: "never-written" }, "NotFoundError");
await fails("tired", { ...me, memories: "{not json" }, "UsageError");
await fails("claim", { ...me, item: "../etc/passwd" }, "UsageError");
await fails("release", { ...me, item: "ticket:none" }, "NotFoundError");
await fails("claim_check", { item: "ticket:none", token: 1 }, "NotFoundError");
await fails("guard", { ...me, paths: ["src/free.py"], run_token: "wrong" }, "ForbiddenError");
await ok("tired", { ...me, memories: ["checked from TypeScript"] });

// push: subscribe to the inbox, then the CLI (another process) sends a signal
const inbox = `synapolis://session/${session}/inbox/ts-bob`;
await client.subscribeResource({ uri: inbox });
cli("signal", "ts-bob", "pushed to TypeScript", "--agent-id", "ts-alice");
await new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error("no notifications/resources/updated within 10 s")), 10000);
  wake = () => { if (notified.includes(inbox)) { clearTimeout(timer); resolve(); } };
  wake();
}).catch((err) => fail(err.message));
checked.notified = true;
const read = await client.readResource({ uri: inbox });
const signals = JSON.parse(read.contents[0].text).signals.map((s) => s.content);
if (!signals.includes("pushed to TypeScript")) fail(`inbox after the push: ${JSON.stringify(signals)}`);

await client.close();
console.log(JSON.stringify(checked));
