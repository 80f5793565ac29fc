// tidelog-typescript-example: produces N keyed records with headers through a
// Tidelog gateway's record-level API (tidelog.v1.Records) and consumes them
// back as a member of a consumer group, committing as it goes, checking that
// every key, value and header arrived. It needs nothing but @grpc/grpc-js and
// the protos of protos/tidelog/v1, loaded by @grpc/proto-loader.
//
//   node examples/typescript/dist/main.js --gateway 127.0.0.1:9395 --topic ts-example --group ts-example --records 1000
//
// The group starts from its committed offsets: records of the topic older
// than this run's (a previous run's, not committed) are read, committed and
// skipped. It exits 0 and prints one line when every record came back
// intact, else it exits 1 naming what was wrong.

import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

const RECORDS_PER_REQUEST = 100;
// Records of credit the consumer keeps granted; it grants more as it
// processes what came.
const CONSUME_WINDOW = 500;

interface Options {
  gateway: string;
  topic: string;
  group: string;
  partitions: number;
  records: number;
  timeoutMs: number;
  protos: string;
}

// The messages as proto-loader gives them: camelCase fields, int64 as
// numbers, enums as their names, bytes as Buffers, scalars at their
// defaults (0, ""), unset messages null, unset oneof members absent.
interface ErrorMsg {
  code: string;
  message: string;
}
interface TopicPartitionMsg {
  topic: string;
  partition: number;
}
interface RecordResult {
  topic: string;
  partition: number;
  offset: number;
  error?: ErrorMsg | null;
}
interface ConsumedRecord {
  topic: string;
  partition: number;
  offset: number;
  key?: Buffer;
  value?: Buffer;
  headers?: { key: string; value: Buffer }[];
}
interface ConsumeResponse {
  records?: ConsumedRecord[];
  errors?: { topic: string; partition: number; error: ErrorMsg }[];
  assignment?: { owned?: TopicPartitionMsg[] };
  commit?: { correlationId: number; error?: ErrorMsg | null };
}

function parseArgs(argv: string[]): Options {
  const options: Options = {
    gateway: "127.0.0.1:9395",
    topic: "ts-example",
    group: "ts-example",
    partitions: 3,
    records: 1000,
    timeoutMs: 60_000,
    protos: path.resolve(__dirname, "../../../protos"),
  };
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--?/, "");
    const value = argv[i + 1];
    if (value === undefined) throw new Error(`--${name} needs a value`);
    switch (name) {
      case "gateway":
      case "topic":
      case "group":
      case "protos":
        options[name] = value;
        break;
      case "partitions":
      case "records":
        options[name] = Number.parseInt(value, 10);
        break;
      case "timeout-ms":
        options.timeoutMs = Number.parseInt(value, 10);
        break;
      default:
        throw new Error(`unknown option --${name}`);
    }
  }
  return options;
}

const isError = (e?: ErrorMsg | null): e is ErrorMsg => e !== undefined && e !== null && e.code !== "NONE";
const key = (i: number): string => `key-${i}`;
const value = (i: number): string => `value-${i}`;

function loadServices(protos: string): { Admin: any; Records: any } {
  const definition = protoLoader.loadSync(
    ["tidelog/v1/admin.proto", "tidelog/v1/records.proto"],
    { includeDirs: [protos], longs: Number, enums: String, defaults: true, oneofs: true },
  );
  const v1 = (grpc.loadPackageDefinition(definition) as any).tidelog.v1;
  return { Admin: v1.Admin, Records: v1.Records };
}

function createTopic(admin: any, o: Options, deadline: Date): Promise<void> {
  return new Promise((resolve, reject) => {
    admin.CreateTopics(
      { topics: [{ name: o.topic, partitions: o.partitions }] },
      { deadline },
      (err: grpc.ServiceError | null, resp: any) => {
        if (err) return reject(new Error(`CreateTopics: ${err.message}`));
        for (const t of resp.topics ?? []) {
          if (isError(t.error) && t.error.code !== "TOPIC_ALREADY_EXISTS") {
            return reject(new Error(`CreateTopics ${t.name}: ${t.error.code}: ${t.error.message}`));
          }
        }
        resolve();
      },
    );
  });
}

// Sends every request without waiting (the stream is pipelined), then
// resolves with one result per record once every answer has come, in order.
function produce(records: any, o: Options, deadline: Date): Promise<RecordResult[]> {
  return new Promise((resolve, reject) => {
    const call = records.Produce({ deadline });
    const results: RecordResult[] = [];
    let next = 0;
    call.on("data", (resp: { correlationId: number; results?: RecordResult[] }) => {
      if (resp.correlationId !== next) {
        call.cancel();
        return reject(new Error(`Produce: answer ${resp.correlationId} came where ${next} was expected`));
      }
      next += RECORDS_PER_REQUEST;
      for (const r of resp.results ?? []) {
        if (isError(r.error)) {
          call.cancel();
          return reject(new Error(`Produce: ${r.topic}-${r.partition}: ${r.error.code}: ${r.error.message}`));
        }
        results.push(r);
      }
    });
    call.on("error", (err: Error) => reject(new Error(`Produce: ${err.message}`)));
    call.on("end", () => {
      if (results.length !== o.records) {
        reject(new Error(`Produce: ${results.length} results for ${o.records} records`));
      } else {
        resolve(results);
      }
    });
    for (let first = 0; first < o.records; first += RECORDS_PER_REQUEST) {
      const batch = [];
      for (let i = first; i < Math.min(first + RECORDS_PER_REQUEST, o.records); i++) {
        batch.push({
          topic: o.topic,
          key: Buffer.from(key(i)),
          value: Buffer.from(value(i)),
          headers: [
            { key: "seq", value: Buffer.from(String(i)) },
            { key: "client", value: Buffer.from("typescript") },
          ],
        });
      }
      call.write({ correlationId: first, acks: "ACKS_ALL", records: batch });
    }
    call.end();
  });
}

// Reads the topic as one member of the group: the gateway joins the group
// for the stream's lifetime, says which partitions the stream owns
// (assignment responses) and starts each from the group's committed offset.
// Each response's records are processed (kept for the check), then committed
// on the same stream, then replaced by as much credit: at-least-once. Resolves
// with this run's records (those at or after start[partition]) once they have
// all come and every commit is answered; cancelling the stream then makes the
// member leave the group.
function consumeInGroup(
  records: any,
  o: Options,
  start: Map<number, number>,
  deadline: Date,
): Promise<ConsumedRecord[]> {
  return new Promise((resolve, reject) => {
    const call = records.Consume({ deadline });
    const owned = new Set<number>();
    const got: ConsumedRecord[] = [];
    let sent = 0;
    let answered = 0;
    let done = false;
    const finish = (err?: Error) => {
      if (done) return;
      done = true;
      call.cancel();
      if (err) reject(err);
      else resolve(got);
    };
    call.on("data", (resp: ConsumeResponse) => {
      for (const e of resp.errors ?? []) {
        return finish(new Error(`Consume: ${e.topic}-${e.partition}: ${e.error.code}: ${e.error.message}`));
      }
      if (resp.assignment) {
        owned.clear();
        for (const tp of resp.assignment.owned ?? []) owned.add(tp.partition);
      } else if (resp.commit) {
        if (isError(resp.commit.error)) {
          return finish(new Error(`commit ${resp.commit.correlationId}: ${resp.commit.error.code}: ${resp.commit.error.message}`));
        }
        answered++;
      } else if (resp.records && resp.records.length > 0) {
        // Process: keep this run's records (older ones are skipped, and committed all the same).
        const next = new Map<number, number>();
        for (const r of resp.records) {
          if (!owned.has(r.partition)) {
            return finish(new Error(`record of ${r.topic}-${r.partition}, a partition the stream does not own`));
          }
          const from = start.get(r.partition);
          if (from !== undefined && r.offset >= from) got.push(r);
          next.set(r.partition, Math.max(next.get(r.partition) ?? 0, r.offset + 1));
        }
        // Then commit what was processed, and grant as much credit again.
        sent++;
        const offsets = [...next].map(([partition, offset]) => ({ topic: o.topic, partition, offset }));
        call.write({ commit: { correlationId: sent, offsets }, creditRecords: resp.records.length });
      }
      if (got.length >= o.records && answered === sent) finish();
    });
    call.on("error", (err: Error) =>
      finish(new Error(`Consume in group ${o.group} (${got.length} of ${o.records} records): ${err.message}`)),
    );
    call.write({ creditRecords: CONSUME_WINDOW, group: { groupId: o.group, topics: [o.topic] } });
  });
}

// Each of the n records exactly once, with its value and headers.
function check(got: ConsumedRecord[], n: number): void {
  if (got.length !== n) throw new Error(`consumed ${got.length} records, produced ${n}`);
  const seen = new Array<boolean>(n).fill(false);
  for (const r of got) {
    const k = r.key?.toString() ?? "";
    const i = Number.parseInt(k.replace(/^key-/, ""), 10);
    if (!(i >= 0 && i < n) || key(i) !== k) throw new Error(`unexpected key ${JSON.stringify(k)} at ${r.topic}-${r.partition}@${r.offset}`);
    if (seen[i]) throw new Error(`key ${k} consumed twice`);
    seen[i] = true;
    const v = r.value?.toString();
    if (v !== value(i)) throw new Error(`key ${k}: value ${JSON.stringify(v)}, want ${value(i)}`);
    const h = (r.headers ?? []).map((x) => `${x.key}=${x.value.toString()}`).join(",");
    if (h !== `seq=${i},client=typescript`) throw new Error(`key ${k}: headers ${h}, want seq=${i},client=typescript`);
  }
}

async function main(): Promise<void> {
  const o = parseArgs(process.argv.slice(2));
  const deadline = new Date(Date.now() + o.timeoutMs);
  const { Admin, Records } = loadServices(o.protos);
  const credentials = grpc.credentials.createInsecure();
  const admin = new Admin(o.gateway, credentials);
  const records = new Records(o.gateway, credentials);
  try {
    await createTopic(admin, o, deadline);
    // Where this run's records start in each partition, so that the check
    // counts exactly what this run wrote.
    const start = new Map<number, number>();
    for (const r of await produce(records, o, deadline)) {
      const off = start.get(r.partition);
      if (off === undefined || r.offset < off) start.set(r.partition, r.offset);
    }
    const got = await consumeInGroup(records, o, start, deadline);
    check(got, o.records);
    console.log(
      `typescript example: produced and consumed ${o.records} records in ${start.size} partitions ` +
        `in group ${o.group}, committed; keys, values and headers intact`,
    );
  } finally {
    admin.close();
    records.close();
  }
}

main().catch((err: Error) => {
  console.error(`typescript example: ${err.message}`);
  process.exit(1);
});
