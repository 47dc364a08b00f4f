// Local stand-in for `https://deno.land/std@<version>/io/mod.ts`, the only deno.land module dspy's
// runner.js imports. rlmoptimizer points that URL here with an import map, so the sandbox starts
// on machines that cannot reach deno.land. It provides what runner.js uses: `readLines`.
//
// Same contract as std's readLines: yields each line of `reader` without its "\n" or "\r\n",
// then the remaining text if the input does not end with a newline. Linear in the input size.

interface Reader {
  read(p: Uint8Array): Promise<number | null>;
}

export async function* readLines(
  reader: Reader,
  decoderOpts?: { encoding?: string; fatal?: boolean; ignoreBOM?: boolean },
): AsyncGenerator<string> {
  const decoder = new TextDecoder(decoderOpts?.encoding ?? "utf-8", decoderOpts);
  const buffer = new Uint8Array(64 * 1024);
  let parts: string[] = [];
  const takeLine = (last: string): string => {
    parts.push(last);
    const line = parts.join("");
    parts = [];
    return line.endsWith("\r") ? line.slice(0, -1) : line;
  };
  while (true) {
    const n = await reader.read(buffer);
    if (n === null) break;
    const text = decoder.decode(buffer.subarray(0, n), { stream: true });
    let start = 0;
    let newline: number;
    while ((newline = text.indexOf("\n", start)) !== -1) {
      yield takeLine(text.slice(start, newline));
      start = newline + 1;
    }
    if (start < text.length) parts.push(text.slice(start));
  }
  const tail = decoder.decode();
  if (tail.length > 0) parts.push(tail);
  if (parts.length > 0) yield takeLine("");
}
