package dev.tidelog.example;

import io.grpc.MethodDescriptor;
import io.grpc.MethodDescriptor.MethodType;
import io.grpc.protobuf.ProtoUtils;
import tidelog.v1.AdminOuterClass.CreateTopicsRequest;
import tidelog.v1.AdminOuterClass.CreateTopicsResponse;
import tidelog.v1.RecordsOuterClass.ConsumeRequest;
import tidelog.v1.RecordsOuterClass.ConsumeResponse;
import tidelog.v1.RecordsOuterClass.RecordsProduceRequest;
import tidelog.v1.RecordsOuterClass.RecordsProduceResponse;

/**
 * The three gRPC methods the example calls, described as protoc-gen-grpc-java would generate
 * them (full name "package.Service/Method", protobuf marshallers of the generated messages).
 * Written here because Maven Central does not serve that plugin's linux-x86_64 binary on this
 * machine; with the plugin, {@code RecordsGrpc.getProduceMethod()} and friends are the same.
 */
final class Calls {
  private Calls() {}

  static final MethodDescriptor<CreateTopicsRequest, CreateTopicsResponse> CREATE_TOPICS =
      MethodDescriptor.<CreateTopicsRequest, CreateTopicsResponse>newBuilder()
          .setType(MethodType.UNARY)
          .setFullMethodName(MethodDescriptor.generateFullMethodName("tidelog.v1.Admin", "CreateTopics"))
          .setRequestMarshaller(ProtoUtils.marshaller(CreateTopicsRequest.getDefaultInstance()))
          .setResponseMarshaller(ProtoUtils.marshaller(CreateTopicsResponse.getDefaultInstance()))
          .build();

  static final MethodDescriptor<RecordsProduceRequest, RecordsProduceResponse> PRODUCE =
      MethodDescriptor.<RecordsProduceRequest, RecordsProduceResponse>newBuilder()
          .setType(MethodType.BIDI_STREAMING)
          .setFullMethodName(MethodDescriptor.generateFullMethodName("tidelog.v1.Records", "Produce"))
          .setRequestMarshaller(ProtoUtils.marshaller(RecordsProduceRequest.getDefaultInstance()))
          .setResponseMarshaller(ProtoUtils.marshaller(RecordsProduceResponse.getDefaultInstance()))
          .build();

  static final MethodDescriptor<ConsumeRequest, ConsumeResponse> CONSUME =
      MethodDescriptor.<ConsumeRequest, ConsumeResponse>newBuilder()
          .setType(MethodType.BIDI_STREAMING)
          .setFullMethodName(MethodDescriptor.generateFullMethodName("tidelog.v1.Records", "Consume"))
          .setRequestMarshaller(ProtoUtils.marshaller(ConsumeRequest.getDefaultInstance()))
          .setResponseMarshaller(ProtoUtils.marshaller(ConsumeResponse.getDefaultInstance()))
          .build();
}
