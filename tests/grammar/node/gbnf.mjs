// structured_outputs.grammar against the gbnf package, a reader of
// llama.cpp's GBNF we did not write (tests/grammar/README.md).
//   node gbnf.mjs GRAMMARS VERDICTS
// For each JSON line {grammar, text, viable, complete} that
// grammar_gbnf_check wrote, asks gbnf whether the text starts a document of
// the grammar (add() does not throw) and whether it is a whole one (an "end"
// among the rules that may follow), and exits 1 on the first verdict that
// differs from ours.
import { readFileSync } from "node:fs";
import GBNF from "gbnf";

const [grammarsPath, verdictsPath] = process.argv.slice(2);
const grammars = JSON.parse(readFileSync(grammarsPath, "utf8"));
const states = grammars.map((g) => GBNF(g));
const lines = readFileSync(verdictsPath, "utf8").split("\n").filter((l) => l.length > 0);
let starts = 0;
let whole = 0;
for (const line of lines) {
  const { grammar, text, viable, complete } = JSON.parse(line);
  let state = states[grammar];
  let gbnfViable = true;
  try {
    if (text.length > 0) state = state.add(text);
  } catch {
    gbnfViable = false;
  }
  const gbnfComplete = gbnfViable && [...state].some((rule) => rule.type === "end");
  if (gbnfViable !== viable || gbnfComplete !== complete) {
    console.error(
      `grammar ${grammar}: ours says start=${viable} whole=${complete}, gbnf says ` +
        `start=${gbnfViable} whole=${gbnfComplete}, of ${JSON.stringify(text)}\n${grammars[grammar]}`);
    process.exit(1);
  }
  starts += gbnfViable;
  whole += gbnfComplete;
}
const version = JSON.parse(readFileSync(new URL("./node_modules/gbnf/package.json", import.meta.url))).version;
console.log(`gbnf ${version} agrees on all ${lines.length} verdicts (${starts} starts, ${whole} whole documents)`);
