// References for the structured outputs' grammar (tests/grammar/README.md).
//   node check.mjs instances SCHEMAS OUT   json-schema-faker's documents of each
//                                          schema, written as JSON lines
//   node check.mjs validate SCHEMAS WALKS  ajv checks each document the grammar
//                                          wrote; exits 1 on the first failure
// Both read the schemas as the grammar does: an object schema without
// additionalProperties gets additionalProperties false (xgrammar's strict
// mode, which json_schema.h follows).
import { readFileSync, writeFileSync } from "node:fs";
import Ajv from "ajv";
import { generateSync } from "json-schema-faker";

function strict(schema) {
  if (Array.isArray(schema)) return schema.map(strict);
  if (schema === null || typeof schema !== "object") return schema;
  const out = {};
  for (const [k, v] of Object.entries(schema)) {
    out[k] = k === "enum" || k === "const" ? v : strict(v);
  }
  const isObject =
    out.type === "object" || "properties" in out || "required" in out;
  if (isObject && !("additionalProperties" in out)) out.additionalProperties = false;
  // In a properties map the keys are names, not keywords.
  if (out.properties) {
    const props = {};
    for (const [name, sub] of Object.entries(schema.properties)) props[name] = strict(sub);
    out.properties = props;
  }
  return out;
}

const [mode, schemasPath, path] = process.argv.slice(2);
const schemas = JSON.parse(readFileSync(schemasPath, "utf8")).map(strict);
const ajv = new Ajv({ strict: false, allErrors: false });

// The value's members in the order its schema lists them (the grammar writes
// properties in that order); anyOf takes the first branch the value matches.
function ordered(value, schema, root) {
  if (schema === true || schema === undefined || schema === null) return value;
  if (schema.$ref) {
    const name = schema.$ref.replace(/^#\/(\$defs|definitions)\//, "");
    const target = schema.$ref === "#" ? root : (root.$defs ?? root.definitions)[name];
    return ordered(value, target, root);
  }
  if (schema.anyOf || schema.allOf) {
    for (const branch of schema.anyOf ?? schema.allOf) {
      const check = ajv.compile({ ...branch, $defs: root.$defs, definitions: root.definitions });
      if (check(value)) return ordered(value, branch, root);
    }
    return value;
  }
  if (Array.isArray(value)) return value.map((v) => ordered(v, schema.items, root));
  if (value !== null && typeof value === "object") {
    const out = {};
    const props = schema.properties ?? {};
    for (const k of Object.keys(props)) if (k in value) out[k] = ordered(value[k], props[k], root);
    for (const k of Object.keys(value)) {
      if (!(k in out)) out[k] = ordered(value[k], schema.additionalProperties, root);
    }
    return out;
  }
  return value;
}

if (mode === "instances") {
  const lines = [];
  schemas.forEach((schema, i) => {
    for (let seed = 1; seed <= 40; ++seed) {
      const value = generateSync(schema, { seed, refDepthMax: 3, maxDefaultItems: 4 });
      if (!ajv.validate(schema, value)) continue;  // the faker's miss, not ours
      const v = ordered(value, schema, schema);
      lines.push(JSON.stringify({ schema: i, doc: JSON.stringify(v) }));
      lines.push(JSON.stringify({ schema: i, doc: JSON.stringify(v, null, seed % 3) }));
    }
  });
  writeFileSync(path, lines.join("\n") + "\n");
  console.log(`instances: ${lines.length} documents of ${schemas.length} schemas`);
} else if (mode === "validate") {
  const walks = readFileSync(path, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));
  const checks = schemas.map((s) => ajv.compile(s));
  for (const { schema, doc } of walks) {
    let value;
    try {
      value = JSON.parse(doc);
    } catch (e) {
      console.error(`schema ${schema}: not JSON (${e.message}): ${doc}`);
      process.exit(1);
    }
    if (!checks[schema](value)) {
      console.error(`schema ${schema}: ajv refuses ${doc}: ${ajv.errorsText(checks[schema].errors)}`);
      process.exit(1);
    }
  }
  console.log(`validate: ajv ${JSON.parse(readFileSync(new URL("./node_modules/ajv/package.json", import.meta.url))).version} accepts all ${walks.length} documents`);
} else {
  console.error("usage: check.mjs instances|validate SCHEMAS PATH");
  process.exit(2);
}
