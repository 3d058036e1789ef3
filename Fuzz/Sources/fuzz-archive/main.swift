// Fuzzes the keyed-archive validator and the secure unarchiving behind it: any bytes must give an
// object or a thrown error, never a crash (corelibs' NSKeyedUnarchiver calls fatalError on much of
// what the validator exists to refuse).
import DocumentEngine
import Foundation

// Also under libFuzzer's name: its main() (in the same archive as the driver) is linked too.
@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOne(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    let data = start.map { Data(bytes: $0, count: count) } ?? Data()
    let limits = KeyedArchive.Limits(maximumSize: 1 << 20, maximumObjectCount: 1 << 14, maximumDepth: 64)
    _ = try? KeyedArchive.validate(data, allowedClassNames: [], limits: limits)
    _ = try? KeyedArchive.unarchivedObject(
        ofClasses: [NSArray.self, NSDictionary.self, NSString.self, NSNumber.self, NSData.self, NSDate.self,
                    NSSet.self, NSOrderedSet.self, NSURL.self, NSUUID.self, NSNull.self],
        from: data, limits: limits)
    return 0
}

// SwiftPM gives an executable its own entry point, so libFuzzer's main() is not used: this one
// hands the command line to libFuzzer's driver, which calls `fuzzOne` for every input.
typealias FuzzerDriver = @convention(c) (
    UnsafeMutablePointer<CInt>, UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
    @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt
guard let driver = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "LLVMFuzzerRunDriver") else {
    fatalError("not built with -sanitize=fuzzer (scripts/fuzz.sh builds it)")
}
var argc = CommandLine.argc
var argv = CommandLine.unsafeArgv
exit(unsafeBitCast(driver, to: FuzzerDriver.self)(&argc, &argv, { fuzzOne($0, $1) }))
