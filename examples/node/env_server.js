#!/usr/bin/env node
// An EnvironmentService in Node.js, from protos/brorl/v1/environment.proto alone: a calculator
// the policy calls with [a*b] (the same rules as brorl's envs/calculator.py). brorl's rollout
// workers drive its episodes over gRPC like any other environment's (docs/environments.md).
//
//   node env_server.js [--port 50054] [--port-file FILE]
//
// Each episode keeps the answer it gave to every turn, so a retried Step (same episode id and
// turn: a lost reply) is answered again without being applied twice; a step out of order is
// FAILED_PRECONDITION, an unknown episode NOT_FOUND, a bad request INVALID_ARGUMENT.
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { parseArgs } = require("node:util");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const PROTOS = path.resolve(__dirname, "..", "..", "protos");
const loaded = protoLoader.loadSync(["brorl/v1/environment.proto"], {
  includeDirs: [PROTOS],
  keepCase: true,
  longs: Number,
  defaults: true,
});
const { EnvironmentService } = grpc.loadPackageDefinition(loaded).brorl.v1;

const MAX_TURNS = 4;
const MAX_EPISODES = 100000;
const CALL = /\[([^\[\]]*)\]\s*$/;
const episodes = new Map(); // episode id -> { reference, turns: [StepResponse], done, calls }

// Non-negative integers joined by + - * (products first), or null: no eval().
function evaluate(expression) {
  if (!expression || expression.length > 64) return null;
  const parts = expression.split(/([+\-*])/);
  const values = [];
  for (let i = 0; i < parts.length; i += 2) {
    const m = /^\s*(\d{1,12})\s*$/.exec(parts[i]);
    if (!m) return null;
    values.push(BigInt(m[1]));
  }
  const sums = [values[0]];
  const signs = [];
  for (let i = 1; i < parts.length; i += 2) {
    const v = values[(i + 1) / 2];
    if (parts[i] === "*") sums[sums.length - 1] *= v;
    else {
      sums.push(v);
      signs.push(parts[i]);
    }
  }
  let total = sums[0];
  signs.forEach((op, i) => {
    total = op === "+" ? total + sums[i + 1] : total - sums[i + 1];
  });
  return total.toString();
}

function fail(callback, code, message) {
  callback({ code, details: message });
}

function checkId(id, callback) {
  if (!id || id.length > 512) {
    fail(callback, grpc.status.INVALID_ARGUMENT, "episode_id: must be 1 to 512 characters");
    return false;
  }
  return true;
}

const service = {
  Reset(call, callback) {
    const { episode_id, reference } = call.request;
    if (!checkId(episode_id, callback)) return;
    if (!episodes.has(episode_id)) {
      if (episodes.size >= MAX_EPISODES) {
        return fail(callback, grpc.status.RESOURCE_EXHAUSTED, `${MAX_EPISODES} episodes held`);
      }
      episodes.set(episode_id, { reference: reference.trim(), turns: [], done: false, calls: 0 });
    }
    callback(null, { observation: { text: "", token_ids: [] }, max_turns: MAX_TURNS });
  },

  Step(call, callback) {
    const { episode_id, turn, action_text, policy_done } = call.request;
    if (!checkId(episode_id, callback)) return;
    if (turn < 1) return fail(callback, grpc.status.INVALID_ARGUMENT, "turn: must be 1 or more");
    const ep = episodes.get(episode_id);
    if (!ep) return fail(callback, grpc.status.NOT_FOUND, `no episode ${episode_id}`);
    if (turn <= ep.turns.length) return callback(null, ep.turns[turn - 1]); // a retry
    if (turn !== ep.turns.length + 1 || ep.done) {
      return fail(
        callback,
        grpc.status.FAILED_PRECONDITION,
        `episode ${episode_id} is at turn ${ep.turns.length}; got turn ${turn}`,
      );
    }
    const tool = CALL.exec(action_text);
    let answer;
    if (tool && !policy_done) {
      ep.calls += 1;
      const value = evaluate(tool[1]);
      answer = { observation: { text: value === null ? "?|" : `${value}|` }, reward: 0, done: false };
    } else {
      const right = action_text.trim() === ep.reference;
      answer = { observation: { text: "" }, reward: right ? 1 : 0, done: true };
    }
    if (turn >= MAX_TURNS) answer.done = true;
    answer.info = { calls: String(ep.calls), server: "node" };
    ep.turns.push(answer);
    ep.done = answer.done;
    callback(null, answer);
  },

  Close(call, callback) {
    episodes.delete(call.request.episode_id);
    callback(null, {});
  },

  Describe(call, callback) {
    callback(null, {
      name: "calculator-node",
      version: "1",
      max_turns: MAX_TURNS,
      description: "a calculator tool environment written in Node.js from the .proto alone",
    });
  },
};

function main() {
  const { values } = parseArgs({
    options: { port: { type: "string", default: "50054" }, "port-file": { type: "string" } },
  });
  const server = new grpc.Server();
  server.addService(EnvironmentService.service, service);
  server.bindAsync(`127.0.0.1:${values.port}`, grpc.ServerCredentials.createInsecure(), (err, port) => {
    if (err) {
      console.error(`error: cannot listen on port ${values.port}: ${err.message}`);
      process.exit(2);
    }
    if (values["port-file"]) fs.writeFileSync(values["port-file"], String(port));
    console.log(`calculator environment (Node.js) on 127.0.0.1:${port}`);
  });
  const stop = () => server.tryShutdown(() => process.exit(0));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main();
