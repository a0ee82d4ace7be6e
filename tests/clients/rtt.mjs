// Round trips of the TypeScript SDK 1.x client (what Claude Code and Gemini CLI connect with) to synapolis
// over stdio (`synapolis mcp`) and over HTTP (`synapolis serve`), side by side: for benchmarks/bench_serve.py.
//
//   node rtt.mjs SYNAPOLIS_CMD_JSON STATE_DIR URL TOKEN CALLS BLOCK IDENTITY_JSON HTTP_AGENT_ID
//
// SYNAPOLIS_CMD_JSON: the command that runs synapolis, as a JSON array; IDENTITY_JSON: {agent_id, session_id,
// run_token} of the stdio client's agent (its server's environment); HTTP_AGENT_ID: who the HTTP client
// starts as, in that session. Each verb: 10 warm-up calls each way,
// then CALLS calls each way in alternating blocks of BLOCK. Prints one JSON line: {verb: {http: [ms...],
// stdio: [ms...]}, _cpu: {verb: {http: ms, stdio: ms}}}, _cpu being this client's own CPU time per call.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [cmdJson, stateDir, url, token, callsArg, blockArg, identityJson, httpAgent] = process.argv.slice(2);
const [command, ...prefix] = JSON.parse(cmdJson);
const me = JSON.parse(identityJson);
const calls = Number(callsArg), block = Number(blockArg);

const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("SYNAPOLIS_")));
Object.assign(env, { SYNAPOLIS_AGENT_ID: me.agent_id, SYNAPOLIS_SESSION_ID: me.session_id,
                     SYNAPOLIS_RUN_TOKEN: me.run_token });
const overStdio = new Client({ name: "synapolis-rtt", version: "1.0.0" });
await overStdio.connect(new StdioClientTransport({ command, args: [...prefix, "--state-dir", stateDir, "mcp"], env }));
const overHttp = new Client({ name: "synapolis-rtt", version: "1.0.0" });
await overHttp.connect(new StreamableHTTPClientTransport(new URL(url + "/mcp"),
  { requestInit: { headers: { Authorization: `Bearer ${token}` } } }));
const started = await overHttp.callTool({ name: "start_session", arguments: { agent_id: httpAgent, session_id: me.session_id } });
if (started.isError) throw new Error(`start_session failed: ${started.content[0].text}`);

const verbs = { "ping (protocol only)": null, read_signals: {}, list_agents: {},
                write_whiteboard: { key: "k", value: "v" } };
async function call(client, verb, args) {
  if (args === null) return client.ping();
  const result = await client.callTool({ name: verb, arguments: args });
  if (result.isError) throw new Error(`${verb} failed: ${result.content[0].text}`);
}

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
