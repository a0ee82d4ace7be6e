// Round trips of the TypeScript SDK 1.x client (what Claude Code and Gemini CLI connect with) to synapolis
// over stdio (`synapolis mcp`) and over HTTP (`synapolis serve`), side by side: for benchmarks/bench_serve.py.
//
//   node rtt.mjs SYNAPOLIS_CMD_JSON STATE_DIR URL TOKEN CALLS BLOCK IDENTITY_JSON HTTP_AGENT_ID [fetch]
//
// SYNAPOLIS_CMD_JSON: the command that runs synapolis, as a JSON array; IDENTITY_JSON: {agent_id, session_id,
// run_token} of the stdio client's agent (its server's environment); HTTP_AGENT_ID: who the HTTP client
// starts as, in that session. Each verb: 10 warm-up calls each way,
// then CALLS calls each way in alternating blocks of BLOCK. Prints one JSON line: {verb: {http: [ms...],
// stdio: [ms...]}, _cpu: {verb: {http: ms, stdio: ms}}}, _cpu being this client's own CPU time per call.
// With `fetch`, only the floors of this client's HTTP, CALLS requests each after 10 warm-up, without the SDK:
// {_fetch: {request: {times: [ms...], cpu: ms}}} (a run of its own, so the server's CPU per SDK call stays apart).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [cmdJson, stateDir, url, token, callsArg, blockArg, identityJson, httpAgent, mode] = process.argv.slice(2);
const [command, ...prefix] = JSON.parse(cmdJson);
const me = JSON.parse(identityJson);
const calls = Number(callsArg), block = Number(blockArg);

const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("SYNAPOLIS_")));
Object.assign(env, { SYNAPOLIS_AGENT_ID: me.agent_id, SYNAPOLIS_SESSION_ID: me.session_id,
                     SYNAPOLIS_RUN_TOKEN: me.run_token });
const overHttp = new Client({ name: "synapolis-rtt", version: "1.0.0" });
await overHttp.connect(new StreamableHTTPClientTransport(new URL(url + "/mcp"),
  { requestInit: { headers: { Authorization: `Bearer ${token}` } } }));

const verbs = { "ping (protocol only)": null, read_signals: {}, list_agents: {},
                write_whiteboard: { key: "k", value: "v" } };
// The floors of this client's HTTP, without the SDK: node's own fetch (what the SDK's transport posts with) of
// the bare route, and of a JSON-RPC ping posted as the SDK posts it, with the session's headers.
async function fetchFloors() {
  const transport = overHttp.transport;
  const headers = { Authorization: `Bearer ${token}`, "content-type": "application/json",
                    accept: "application/json, text/event-stream", "mcp-session-id": transport.sessionId,
                    "mcp-protocol-version": transport.protocolVersion ?? "2025-11-25" };
  let pingId = 1_000_000;
  const floors = {
    "GET /healthz": async () => {
      const r = await fetch(url + "/healthz");
      if (!r.ok) throw new Error(`healthz ${r.status}`);
      await r.text();
    },
    "POST /mcp ping": async () => {
      const r = await fetch(url + "/mcp", { method: "POST", headers,
                                           body: JSON.stringify({ jsonrpc: "2.0", id: pingId++, method: "ping" }) });
      const answer = await r.json();
      if (!r.ok || !answer.result) throw new Error(`ping ${r.status}: ${JSON.stringify(answer)}`);
    },
  };
  const found = {};
  for (const [name, request] of Object.entries(floors)) {
    for (let i = 0; i < 10; i++) await request();
    const times = [], used = process.cpuUsage();
    for (let i = 0; i < calls; i++) {
      const began = performance.now();
      await request();
      times.push(performance.now() - began);
    }
    const spent = process.cpuUsage(used);
    found[name] = { times, cpu: (spent.user + spent.system) / 1000 / calls };
  }
  return found;
}

async function call(client, verb, args) {
  if (args === null) return client.ping();
  const result = await client.callTool({ name: verb, arguments: args });
  if (result.isError) throw new Error(`${verb} failed: ${result.content[0].text}`);
}

if (mode === "fetch") {
  console.log(JSON.stringify({ _fetch: await fetchFloors() }));
  await overHttp.close();
  process.exit(0);
}
const started = await overHttp.callTool({ name: "start_session", arguments: { agent_id: httpAgent, session_id: me.session_id } });
if (started.isError) throw new Error(`start_session failed: ${started.content[0].text}`);
const overStdio = new Client({ name: "synapolis-rtt", version: "1.0.0" });
await overStdio.connect(new StdioClientTransport({ command, args: [...prefix, "--state-dir", stateDir, "mcp"], env }));
const out = { _cpu: {} };
for (const [verb, args] of Object.entries(verbs)) {
  out[verb] = { http: [], stdio: [] };
  const cpu = out._cpu[verb] = { http: 0, stdio: 0 };
  for (let i = 0; i < 10; i++) { await call(overHttp, verb, args); await call(overStdio, verb, args); }
  for (let done = 0; done < calls; done += block) {
    for (const [side, client] of [["http", overHttp], ["stdio", overStdio]]) {
      const used = process.cpuUsage();
      for (let i = 0; i < block; i++) {
        const began = performance.now();
        await call(client, verb, args);
        out[verb][side].push(performance.now() - began);
      }
      const spent = process.cpuUsage(used);
      cpu[side] += (spent.user + spent.system) / 1000 / calls;  // µs to ms, per call
    }
  }
}
console.log(JSON.stringify(out));
await overHttp.close();
await overStdio.close();
