// docfs-bench: the helper program of scripts/bench.sh.
//
// Each subcommand does one measured operation and prints its result on standard output, so
// that the script can run the same operation against the DocFS mount and the native folder,
// interleaved, and collect the samples. `report` turns the samples into the table and the JSON
// file. Run by scripts/bench.sh; `docfs-bench help` lists the subcommands.

import Foundation

#if canImport(Glibc)
    import Glibc
#endif

let usage = """
    usage: docfs-bench COMMAND ARGUMENTS

    Making the data (not timed):
      mkfile PATH BYTES                 pseudo-random bytes (never deduplicated)
      mktext PATH BYTES                 lines of text
      mkfiles DIR COUNT BYTES           COUNT files f00000… of distinct bytes in DIR
      mkroots STORE NATIVE COUNT        COUNT small package documents in NATIVE and in STORE

    Measuring (one sample each, on standard output):
      append FILE TEXT                  open O_APPEND, write, fsync, close: milliseconds
      replace SRC DEST                  DEST := SRC (O_TRUNC, write, fsync, close): milliseconds
      seqwrite FILE BYTES               1 MiB writes, fsync, close: MiB/s
      seqread FILE                      1 MiB reads to the end: MiB/s
      smallfiles DIR COUNT BYTES        create+write+close, stat, unlink COUNT files: three rates per second
      holdopen ROOT COUNT PID           open a file in each of COUNT documents under ROOT and
                                        read 4 KiB of it; with all of them open, print PID's VmHWM
                                        and VmRSS in KiB
      propagate WRITE READ TEXT         B8: WRITE := TEXT (fsync, close): milliseconds from the fsync
                                        until READ (the same file through another mount) reads TEXT
      propagate-create CREATE SEEN      B8: create CREATE (write, fsync, close): milliseconds from
                                        the open until SEEN (its name through another mount) exists
      engine STORE DOC FOLDER ROUNDS    B6: Document.open and a one-wrapper save, store vs folder;
                                        prints sample lines (figure side round value)

    Reporting:
      report SAMPLES JSON               the table (stdout) and the JSON file from the samples
    """

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("docfs-bench: \(message)\n".utf8))
    exit(1)
}

func argument(_ index: Int, _ name: String) -> String {
    let arguments = CommandLine.arguments
    guard arguments.count > index else { fail("missing \(name)\n\(usage)") }
    return arguments[index]
}

func integer(_ index: Int, _ name: String) -> Int {
    guard let value = Int(argument(index, name)) else { fail("\(name) must be a whole number") }
    return value
}

@MainActor
func runCommand() async {
    let command = CommandLine.arguments.count > 1 ? CommandLine.arguments[1] : "help"
    do {
        switch command {
        case "mkfile":
            try Data.writePseudoRandom(to: argument(2, "PATH"), count: integer(3, "BYTES"), seed: 1)
        case "mktext":
            try makeText(at: argument(2, "PATH"), count: integer(3, "BYTES"))
        case "mkfiles":
            try makeFiles(in: argument(2, "DIR"), count: integer(3, "COUNT"), size: integer(4, "BYTES"))
        case "mkroots":
            try makeRoots(
                store: argument(2, "STORE"), native: argument(3, "NATIVE"), count: integer(4, "COUNT"))
        case "append":
            print(format(try appendLine(to: argument(2, "FILE"), text: argument(3, "TEXT"))))
        case "replace":
            print(format(try replaceFile(argument(3, "DEST"), with: argument(2, "SRC"))))
        case "seqwrite":
            print(format(try sequentialWrite(argument(2, "FILE"), count: integer(3, "BYTES"))))
        case "seqread":
            print(format(try sequentialRead(argument(2, "FILE"))))
        case "smallfiles":
            let rates = try smallFiles(
                in: argument(2, "DIR"), count: integer(3, "COUNT"), size: integer(4, "BYTES"))
            print("\(format(rates.create)) \(format(rates.stat)) \(format(rates.delete))")
        case "holdopen":
            let (hwm, rss) = try holdOpen(
                root: argument(2, "ROOT"), count: integer(3, "COUNT"), daemon: pid_t(integer(4, "PID")))
            print("\(hwm) \(rss)")
        case "propagate":
            print(format(try propagateSave(
                write: argument(2, "WRITE"), read: argument(3, "READ"), text: argument(4, "TEXT"))))
        case "propagate-create":
            print(format(try propagateCreate(create: argument(2, "CREATE"), seen: argument(3, "SEEN"))))
        case "engine":
            try await EngineBenchmark(
                storePath: argument(2, "STORE"), documentName: argument(3, "DOC"),
                folder: argument(4, "FOLDER"),
                rounds: integer(5, "ROUNDS")
            ).run()
        case "report":
            try Report(samplesPath: argument(2, "SAMPLES")).write(jsonPath: argument(3, "JSON"))
        case "help", "-h", "--help":
            print(usage)
        default:
            fail("unknown command \(command)\n\(usage)")
        }
    } catch {
        fail("\(command): \(error)")
    }
}

await runCommand()
