#!/usr/bin/env node
// A brorl client in Node.js, from the .proto files alone: start a run on a learner, follow its
// metrics, then sample a completion from a rollout worker. README.md beside this file says how.
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { parseArgs } = require("node:util");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const USAGE = `usage: node client.js LEARNER ROLLOUT RUN_CONFIG [--token TOKEN | --token-file FILE]
                      [--tls-ca FILE] [--steps N] [--prompt TEXT] [--max-tokens N]
  LEARNER, ROLLOUT  HOST:PORT of a learner and of a rollout worker
  RUN_CONFIG        a run config YAML file (what \`brorl run start\` takes)
  --token, --token-file  the cluster's shared token (sent as 'authorization: Bearer <token>')
  --tls-ca FILE     PEM CA of a TLS cluster (without it, plaintext)
  --steps N         stop watching after N training steps (default: until the run ends)
  --prompt TEXT     prompt for Generate (default "12+34=", the demo's task)
  --max-tokens N    new tokens of that completion (default 8)`;

// The contract, read at run time from the repository: no generated code to keep in step with it.
// keepCase: fields keep their .proto names (run_id, config_yaml); longs: int64 steps as numbers.
const PROTOS = path.resolve(__dirname, "..", "..", "protos");
const loaded = protoLoader.loadSync(["brorl/v1/learner.proto", "brorl/v1/rollout.proto"], {
  includeDirs: [PROTOS],
  keepCase: true,
  longs: Number,
  defaults: true,
});
const { LearnerService, RolloutService } = grpc.loadPackageDefinition(loaded).brorl.v1;

// Metric events that end WatchRun's stream (services/learner/observe/runstate.py).
const FINAL_EVENTS = new Set(["done", "failed", "stopped"]);

class UsageError extends Error {}

function positiveInt(text, flag) {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) {
    throw new UsageError(`error: ${flag} ${text}: not a positive integer`);
  }
  return n;
}

function parseCommandLine(argv) {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      token: { type: "string" },
      "token-file": { type: "string" },
      "tls-ca": { type: "string" },
      steps: { type: "string" },
      prompt: { type: "string", default: "12+34=" },
      "max-tokens": { type: "string", default: "8" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  if (positionals.length !== 3) throw new UsageError(USAGE);
  const [learner, rollout, runConfig] = positionals;
  const token = values["token-file"]
    ? fs.readFileSync(values["token-file"], "utf8").trim() // as the services read it
    : values.token;
  return {
    learner,
    rollout,
    configYaml: fs.readFileSync(runConfig, "utf8"),
    token,
    ca: values["tls-ca"] && fs.readFileSync(values["tls-ca"]),
    maxSteps: values.steps === undefined ? Infinity : positiveInt(values.steps, "--steps"),
    prompt: values.prompt,
    maxTokens: positiveInt(values["max-tokens"], "--max-tokens"),
  };
}

// The token travels as per-call metadata, not channel credentials: grpc-js refuses call
// credentials on a plaintext channel, and a loopback cluster without TLS may still want a token.
function callMetadata(token) {
  const metadata = new grpc.Metadata();
  if (token) metadata.set("authorization", `Bearer ${token}`);
  return metadata;
}

const deadline = (seconds) => ({ deadline: Date.now() + seconds * 1000 });

// grpc-js's unary calls take a callback; this turns one into a promise.
function unary(client, method, request, metadata, seconds) {
  return new Promise((resolve, reject) =>
    client[method](request, metadata, deadline(seconds), (err, reply) =>
      err ? reject(err) : resolve(reply)
    )
  );
}

// Prints one line per training step (a metric with no event and a loss; "start", "eval",
// "skipped_step" are not steps) until the run ends or maxSteps steps were seen.
function watchRun(learner, runId, metadata, maxSteps) {
  return new Promise((resolve, reject) => {
    let steps = 0;
    const stream = learner.WatchRun({ run_id: runId, from_step: 0 }, metadata);
    stream.on("data", (metric) => {
      const v = metric.values;
      if (FINAL_EVENTS.has(metric.event)) {
        console.log(`run ${metric.event}${metric.message ? `: ${metric.message}` : ""}`);
      } else if (metric.event === "" && "learner/loss" in v && steps < maxSteps) {
        steps += 1;
        console.log(
          `step ${metric.step} loss=${v["learner/loss"].toFixed(4)} ` +
            `reward=${(v["learner/reward_mean"] ?? 0).toFixed(3)} ` +
            `weight_version=${v["learner/weight_version"] ?? 0}`
        );
        if (steps >= maxSteps) {
          console.log(`stopped watching after ${steps} steps; the run continues on the learner`);
          stream.cancel(); // ends the stream with CANCELLED, handled below
        }
      }
    });
    stream.on("error", (err) => (err.code === grpc.status.CANCELLED ? resolve() : reject(err)));
    stream.on("end", resolve);
  });
}

async function main() {
  const args = parseCommandLine(process.argv.slice(2));
  const credentials = args.ca
    ? grpc.credentials.createSsl(args.ca)
    : grpc.credentials.createInsecure();
  const metadata = callMetadata(args.token);
  const learner = new LearnerService(args.learner, credentials);
  const rollout = new RolloutService(args.rollout, credentials);

  // 1. Start the run. The learner validates the config and answers at once; training goes on.
  const run = await unary(learner, "StartRun", { config_yaml: args.configYaml }, metadata, 120);
  console.log(`started ${run.run_id} (${run.total_steps} steps) in ${run.run_dir}`);

  // 2. Follow its metrics (WatchRun streams past metrics first, then new ones as they come).
  await watchRun(learner, run.run_id, metadata, args.maxSteps);
  const info = await unary(learner, "GetRun", { run_id: run.run_id }, metadata, 30);
  console.log(`run ${info.run_id}: ${info.state} at step ${info.step}/${info.total_steps}`);
  if (info.state === "failed" || info.state === "stopped") return 1;

  // 3. Sample one greedy completion from the rollout worker.
  const request = {
    prompt: args.prompt,
    sampling: { n: 1, temperature: 0, max_tokens: args.maxTokens },
  };
  const reply = await unary(rollout, "Generate", request, metadata, 300);
  const completion = reply.paths[0];
  console.log(
    `completion of ${JSON.stringify(args.prompt)}: ${JSON.stringify(completion.text)} ` +
      `(weight_version ${reply.weight_version}, ${completion.finish_reason})`
  );
  return 0;
}

// Exit codes as the brorl CLI's (docs/cluster.md): 2 bad input or an error a service returned,
// 1 a run that ended other than finished.
main().then(
  (code) => process.exit(code),
  (err) => {
    if (err instanceof UsageError || String(err.code).startsWith("ERR_PARSE_ARGS")) {
      console.error(err instanceof UsageError ? err.message : `error: ${err.message}\n${USAGE}`);
    } else if (typeof err.code === "number") {
      console.error(`error: ${grpc.status[err.code]}: ${err.details}`);
    } else {
      console.error(`error: ${err.message}`);
    }
    process.exit(2);
  }
);
