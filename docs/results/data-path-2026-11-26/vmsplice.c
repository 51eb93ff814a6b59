#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <time.h>
#include <sys/mman.h>
#define BS (128*1024)
#define MEM (256UL<<20)
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){
  int mode=atoi(argv[1]); long n=atol(argv[2]); int bs=argc>3?atoi(argv[3]):BS;
  int sv[2]; socketpair(AF_UNIX,SOCK_STREAM,0,sv);
  pid_t p=fork();
  if(p==0){ close(sv[0]); char*b=malloc(bs); long tot=0,want=(long)n*(bs+16);
    while(tot<want){ssize_t r=recv(sv[1],b,bs,0); if(r<=0)break; tot+=r;} _exit(0);}
  close(sv[1]);
  char*mem=mmap(0,MEM,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  memset(mem,1,MEM);
  int pf[2]; pipe2(pf,0); fcntl(pf[1],F_SETPIPE_SZ,1<<20);
  char hdr[16]={0}; unsigned long seed=1;
  struct rusage r0,r1; getrusage(RUSAGE_SELF,&r0); double t0=now();
  for(long i=0;i<n;i++){
    seed=seed*6364136223846793005UL+1; size_t off=((seed>>20)%(MEM/bs))*bs;
    if(mode==0){ struct iovec iv[2]={{hdr,16},{mem+off,bs}}; struct msghdr m={0}; m.msg_iov=iv; m.msg_iovlen=2;
      size_t left=16+bs; while(left){ssize_t w=sendmsg(sv[0],&m,0); if(w<0){perror("send");exit(1);} left-=w;
        while(w>0 && m.msg_iovlen){ if((size_t)w>=m.msg_iov[0].iov_len){w-=m.msg_iov[0].iov_len;m.msg_iov++;m.msg_iovlen--;} else {m.msg_iov[0].iov_base=(char*)m.msg_iov[0].iov_base+w;m.msg_iov[0].iov_len-=w;w=0;}}}
    } else {
      if(write(pf[1],hdr,16)!=16){perror("w");exit(1);}
      struct iovec iv={mem+off,bs}; size_t done=0;
      while(done<(size_t)bs){ssize_t v=vmsplice(pf[1],&iv,1,0); if(v<0){perror("vmsplice");exit(1);} done+=v; iv.iov_base=(char*)iv.iov_base+v; iv.iov_len-=v;
        }
      size_t left=16+bs; while(left){ssize_t s=splice(pf[0],0,sv[0],0,left,SPLICE_F_MOVE); if(s<=0){perror("splice");exit(1);} left-=s;}
    }
  }
  double t=now()-t0; getrusage(RUSAGE_SELF,&r1);
  double cpu=(r1.ru_utime.tv_sec-r0.ru_utime.tv_sec)+(r1.ru_stime.tv_sec-r0.ru_stime.tv_sec)+((r1.ru_utime.tv_usec-r0.ru_utime.tv_usec)+(r1.ru_stime.tv_usec-r0.ru_stime.tv_usec))/1e6;
  waitpid(p,0,0);
  printf("mode=%d bs=%d MiB/s=%.0f sender_cpu_us/io=%.2f\n",mode,bs,(double)n*bs/t/1048576,cpu*1e6/n);
}
