// Constrained output of `ds41 serve` through the official OpenAI SDK, validated with ajv:
//   node api_structured.mjs PORT_PLAIN PORT_SPEC
// - 100 generated JSON Schemas (seeded): each reply parses and validates against its schema;
// - guided_regex / guided_choice / grammar (GBNF) / json_object replies match their constraint;
// - forced tool calls (tool_choice required / named, parallel_tool_calls false, thinking):
//   arguments validate against the parameters schema, no markup in content, streamed deltas
//   assemble into the same calls;
// - exact mode: each of 9 constrained and unconstrained requests alone equals the same request
//   among the 8 others sent at once, on the plain and the speculative server, and the plain
//   server's replies equal the speculative one's (greedy).
import OpenAI from "../oracle/node_modules/openai/index.mjs";
import Ajv from "../oracle/node_modules/ajv/dist/ajv.js";

const [pa, pb] = process.argv.slice(2).map(Number);
const client = (p) => new OpenAI({ baseURL: `http://127.0.0.1:${p}/v1`, apiKey: "none", maxRetries: 0, timeout: 120000 });
const A = client(pa), B = client(pb);
const ok = (name, cond, why) => console.log(cond ? `PASS ${name}` : `FAIL ${name}: ${why}`);

let seed = 20261205;
const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return Math.floor((seed / 2147483648) * n); };
const pick = (a) => a[rnd(a.length)];

// a small random schema: bounded strings and arrays, so that replies end within max_tokens
function genSchema(depth) {
  const k = rnd(depth > 1 ? 6 : 9);
  if (k === 0) return { type: "string", maxLength: 1 + rnd(6) };
  if (k === 1) return { type: "integer" };
  if (k === 2) return { type: "number" };
  if (k === 3) return { type: "boolean" };
  if (k === 4) return { enum: [pick(["a", "b", "c"]), rnd(10), null].slice(0, 1 + rnd(3)) };
  if (k === 5) return { type: ["string", "null"], maxLength: 3 };
  if (k === 6) return { type: "array", items: genSchema(depth + 1), maxItems: 1 + rnd(3), minItems: rnd(2) };
  if (k === 7) return { anyOf: [genSchema(depth + 1), { type: "null" }] };
  const props = {}, req = [];
  const n = 1 + rnd(3);
  for (let i = 0; i < n; i++) {
    const name = pick(["id", "name", "ok", "v", "tags", "x"]) + i;
    props[name] = genSchema(depth + 1);
    if (rnd(2)) req.push(name);
  }
  return { type: "object", properties: props, required: req, additionalProperties: false };
}

const msg = (t) => [{ role: "user", content: t }];
async function run() {
  const ajv = new Ajv.default({ strict: false });
  let bad = [], lengths = 0;
  const N = 100;
  for (let i = 0; i < N; i++) {
    const schema = genSchema(0);
    const s2 = i % 10 === 0 ? { $defs: { item: schema }, type: "object", properties: { item: { $ref: "#/$defs/item" } }, required: ["item"], additionalProperties: false } : schema;
    const r = await A.chat.completions.create({
      model: "demo", messages: msg("Reply in JSON " + i), max_tokens: 400, temperature: i % 2 ? 0.8 : 0, seed: i,
      response_format: { type: "json_schema", json_schema: { name: "s" + i, schema: s2, strict: true } },
    });
    const c = r.choices[0];
    if (c.finish_reason === "length") lengths++;
    let v;
    try { v = JSON.parse(c.message.content); } catch (e) { bad.push(`${i}: not JSON (${c.finish_reason}): ${c.message.content.slice(0, 80)}`); continue; }
    if (!ajv.validate(s2, v)) bad.push(`${i}: invalid: ${JSON.stringify(ajv.errors).slice(0, 120)} for ${c.message.content.slice(0, 80)}`);
  }
  ok(`structured_${N}_schemas_validate`, bad.length === 0, `${bad.length} of ${N} (${lengths} cut by max_tokens): ${bad.slice(0, 3).join(" | ")}`);

  // the other front ends
  const one = async (extra, max = 40) => (await A.chat.completions.create({ model: "demo", messages: msg("Go"), max_tokens: max, temperature: 0.9, seed: 4, ...extra })).choices[0];
  let c = await one({ guided_regex: "[a-z]{2,5}-[0-9]{3}" });
  ok("structured_guided_regex", /^[a-z]{2,5}-[0-9]{3}$/.test(c.message.content) && c.finish_reason === "stop", JSON.stringify(c.message.content));
  c = await one({ guided_choice: ["alpha", "beta", "gamma delta"] });
  ok("structured_guided_choice", ["alpha", "beta", "gamma delta"].includes(c.message.content), JSON.stringify(c.message.content));
  c = await one({ grammar: 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?' });
  ok("structured_gbnf", /^\([1-9][0-9]?(\+[1-9][0-9]?)*\)$/.test(c.message.content), JSON.stringify(c.message.content));
  c = await one({ structured_outputs: { choice: ["x", "y"] } });
  ok("structured_outputs_choice", ["x", "y"].includes(c.message.content), JSON.stringify(c.message.content));
  c = await one({ response_format: { type: "json_object" } }, 300);
  let parsed = null;
  try { parsed = JSON.parse(c.message.content); } catch (e) {}
  ok("structured_json_object", c.finish_reason === "length" || (parsed && typeof parsed === "object" && !Array.isArray(parsed)),
     `${c.finish_reason}: ${c.message.content.slice(0, 100)}`);
  // streamed: the concatenated deltas are the constrained text
  const st = await A.chat.completions.create({ model: "demo", messages: msg("Go"), max_tokens: 20, temperature: 0, stream: true, guided_regex: "(ab|cd){3}" });
  let txt = "";
  for await (const ch of st) txt += ch.choices[0]?.delta?.content ?? "";
  ok("structured_stream", /^(ab|cd){3}$/.test(txt), JSON.stringify(txt));
  // refusals name the member
  for (const [name, extra, param] of [["minimum", { guided_json: { type: "integer", minimum: 1 } }, "guided_json"],
                                      ["two", { guided_regex: "a", guided_choice: ["b"] }, "guided_choice"],
                                      ["gbnf", { grammar: "root ::= x" }, "grammar"],
                                      ["format", { response_format: { type: "json_schema", json_schema: { name: "f", schema: { type: "string", format: "uri" } } } }, "response_format"]]) {
    let err = null;
    try { await one(extra); } catch (e) { err = e; }
    ok(`structured_refuse_${name}`, err && err.status === 400 && err.param === param, err ? `${err.status} ${err.param} ${err.message}` : "accepted");
  }

  // forced tool calls: the arguments satisfy the parameters schema; no markup in content
  const tools = [
    { type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string", maxLength: 10 }, days: { type: "integer" }, unit: { type: "string", enum: ["c", "f"] } }, required: ["city", "days"] } } },
    { type: "function", function: { name: "add", parameters: { type: "object", properties: { a: { type: "number" }, b: { type: "number" } }, required: ["a", "b"], additionalProperties: false } } },
  ];
  const schemaOf = Object.fromEntries(tools.map((t) => [t.function.name, t.function.parameters]));
  const clean = (c) => !c || (!c.includes("DSML") && !c.includes("</think>"));
  const checkCalls = (calls, name, n) => {
    if (!calls || (n && calls.length !== n) || calls.length < 1) return `calls ${JSON.stringify(calls)}`;
    for (const tc of calls) {
      if (name && tc.function.name !== name) return `name ${tc.function.name}`;
      if (!schemaOf[tc.function.name]) return `unknown ${tc.function.name}`;
      let a;
      try { a = JSON.parse(tc.function.arguments); } catch (e) { return `arguments not JSON: ${tc.function.arguments}`; }
      if (!ajv.validate(schemaOf[tc.function.name], a)) return `arguments ${tc.function.arguments}: ${JSON.stringify(ajv.errors)}`;
    }
    return "";
  };
  for (const [tag, extra, name, n] of [["required", { tool_choice: "required" }, null, 0],
                                       ["named", { tool_choice: { type: "function", function: { name: "add" } } }, "add", 0],
                                       ["named_single", { tool_choice: { type: "function", function: { name: "get_weather" } }, parallel_tool_calls: false }, "get_weather", 1],
                                       ["required_thinking", { tool_choice: "required", reasoning_effort: "high" }, null, 0]]) {
    // thinking: the call is forced once the reasoning ends (after </think>), and the reasoning
    // cannot end the reply (the end token is banned before </think>): the reply is the forced
    // call or, when the reasoning runs out of tokens, "length" with no call; never a "stop"
    // without one (what a model that stopped inside its reasoning gave before). The demo model
    // does not end its reasoning within 400 tokens at these settings, so the second arm is
    // what this case sees today.
    for (const temperature of tag.includes("thinking") ? [0.9] : [0, 0.9]) {
      const r = await A.chat.completions.create({ model: "demo", messages: msg("Call a tool"), tools, max_tokens: 400, temperature, seed: 6, ...extra });
      const c = r.choices[0];
      const why = checkCalls(c.message.tool_calls, name, n);
      const called = !why && c.finish_reason === "tool_calls" && clean(c.message.content);
      const ranOut = tag.includes("thinking") && c.finish_reason === "length" && !c.message.tool_calls && !c.message.content;
      ok(`tools_${tag}_t${temperature}`, called || ranOut, `${why} finish ${c.finish_reason} content ${JSON.stringify(c.message.content)}`);
    }
  }
  {
    // streamed: the deltas assemble into the same calls as the whole reply
    const body = { model: "demo", messages: msg("Call a tool"), tools, max_tokens: 400, temperature: 0, tool_choice: "required" };
    const whole = (await A.chat.completions.create(body)).choices[0].message.tool_calls;
    const st = await A.chat.completions.create({ ...body, stream: true });
    const calls = [];
    let content = "", fin = null;
    for await (const ch of st) {
      const d = ch.choices[0]?.delta ?? {};
      content += d.content ?? "";
      for (const tc of d.tool_calls ?? []) {
        calls[tc.index] ??= { function: { name: "", arguments: "" } };
        if (tc.function?.name) calls[tc.index].function.name += tc.function.name;
        calls[tc.index].function.arguments += tc.function?.arguments ?? "";
      }
      fin = ch.choices[0]?.finish_reason ?? fin;
    }
    const same = calls.length === whole.length && calls.every((c, i) => c.function.name === whole[i].function.name && c.function.arguments === whole[i].function.arguments);
    ok("tools_stream_deltas", same && fin === "tool_calls" && clean(content), `${JSON.stringify(calls)} vs ${JSON.stringify(whole)} finish ${fin}`);
  }

  // exact: alone = among neighbours; plain = speculative
  const reqs = [
    { response_format: { type: "json_schema", json_schema: { name: "a", schema: { type: "object", properties: { a: { type: "integer" }, b: { type: "string", maxLength: 4 } }, required: ["a", "b"], additionalProperties: false } } }, max_tokens: 60 },
    { guided_regex: "[a-z ]{4,12}\\.", max_tokens: 30, temperature: 0.7, seed: 2 },
    { max_tokens: 25 },
    { guided_choice: ["one", "two", "three"], max_tokens: 10 },
    { response_format: { type: "json_object" }, max_tokens: 40, temperature: 0.9, seed: 5 },
    { max_tokens: 30, temperature: 1.0, seed: 9, frequency_penalty: 0.5 },
    { grammar: 'root ::= ("x" | "yz")+ "!"', max_tokens: 20 },
    { guided_json: { type: "array", items: { type: "number" }, maxItems: 4 }, max_tokens: 60 },
    { tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { x: { type: "integer" } }, required: ["x"] } } }], tool_choice: "required", max_tokens: 200 },
  ];
  const go = (cl, r, i) => cl.chat.completions.create({ model: "demo", messages: msg("Sample " + i), temperature: 0, ...r }).then((x) => x.choices[0].message.content);
  const res = {};
  for (const [cl, tag] of [[A, "plain"], [B, "spec"]]) {
    const alone = [];
    for (let i = 0; i < reqs.length; i++) alone.push(await go(cl, reqs[i], i));
    const together = await Promise.all(reqs.map((r, i) => go(cl, r, i)));
    const diff = reqs.map((_, i) => i).filter((i) => alone[i] !== together[i]);
    ok(`structured_batch_invariant_${tag}`, diff.length === 0, `requests ${diff} differ: ${diff.map((i) => JSON.stringify([alone[i], together[i]])).join(" ")}`);
    res[tag] = alone;
  }
  const greedy = reqs.map((r, i) => i).filter((i) => !reqs[i].temperature);
  const d2 = greedy.filter((i) => res.plain[i] !== res.spec[i]);
  ok("structured_spec_equals_plain", d2.length === 0, `greedy requests ${d2} differ`);
}
run().catch((e) => { console.log(`FAIL structured_run: ${e.stack || e}`); process.exit(1); });
