// One host process of the TypeScript SDK tests: runs the turns it is given with the
// unmodified `@openai/codex-sdk`, `rethread` as its codex, and prints one JSON line with what
// the SDK returned. A new process per step: the SDK keeps nothing, so each is a host restart.
//
// Input (JSON in argv[2]): { sdk, rethread, env, work, resume?, prompts: [..] }.
import { pathToFileURL } from "node:url";

const step = JSON.parse(process.argv[2]);
const { Codex } = await import(pathToFileURL(step.sdk).href);
const codex = new Codex({ codexPathOverride: step.rethread, env: step.env });
const options = { workingDirectory: step.work, skipGitRepoCheck: true };
const thread = step.resume ? codex.resumeThread(step.resume, options) : codex.startThread(options);
const runs = [];
for (const prompt of step.prompts) {
  const result = await thread.run(prompt);
  runs.push({ thread_id: thread.id, final: result.finalResponse, items: result.items });
}
console.log(JSON.stringify(runs));
